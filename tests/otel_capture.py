"""The OpenTelemetry SDK as stepcore's telemetry tests see it: one process-wide tracer and meter provider
(set here when none is), an in-memory exporter and reader, and what they received."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

__all__ = ('Capture', 'fresh_capture')

_READER = 'stepcore_tests_metric_reader'
"""Where the first module that set the meter provider keeps its reader, for the next module."""


@dataclass
class Capture:
    """What the SDK received: finished spans, and the metrics as the reader collects them."""

    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        """stepcore's finished spans (named `name`), oldest first."""
        found = [
            s
            for s in self.exporter.get_finished_spans()
            if s.instrumentation_scope is not None and s.instrumentation_scope.name == 'stepcore'
        ]
        return sorted((s for s in found if name is None or s.name == name), key=lambda s: s.start_time or 0)

    def all_spans(self) -> list[ReadableSpan]:
        """Every finished span (pydantic-ai's too), oldest first."""
        return sorted(self.exporter.get_finished_spans(), key=lambda s: s.start_time or 0)

    def metric(self, name: str, **attributes: object) -> float:
        """The sum (a counter), the count (a histogram) or the value (a gauge) of `name` over its points
        whose attributes include `attributes`."""
        total = 0.0
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        if not attributes.items() <= dict(point.attributes or {}).items():
                            continue
                        if isinstance(point, HistogramDataPoint):
                            total += point.count
                        elif isinstance(point, NumberDataPoint):
                            total += point.value
        return total


def _capture() -> Capture:
    """The process's SDK providers (set here when none is), with an exporter of its own."""
    tracer_provider = trace.get_tracer_provider()
    if not isinstance(tracer_provider, TracerProvider):
        tracer_provider = TracerProvider()
        trace.set_tracer_provider(tracer_provider)
    exporter = InMemorySpanExporter()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = metrics.get_meter_provider()
    reader: InMemoryMetricReader | None = getattr(meter_provider, _READER, None)
    if reader is None:
        reader = InMemoryMetricReader()
        meter_provider = MeterProvider(metric_readers=[reader])
        metrics.set_meter_provider(meter_provider)
        assert metrics.get_meter_provider() is meter_provider, 'another meter provider was set in this process'
        setattr(meter_provider, _READER, reader)
    return Capture(exporter, reader)


@functools.cache
def _process_capture() -> Capture:
    return _capture()


def fresh_capture() -> Capture:
    """The process's capture, its exporter emptied (the metrics keep adding up: compare before and after)."""
    found = _process_capture()
    found.exporter.clear()
    return found
