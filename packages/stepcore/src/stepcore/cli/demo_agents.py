"""The demo's scripted agents: an assistant that delegates research, writes a file and sends an email.

The models are pydantic-ai `FunctionModel`s that pick the next step from the history, so the demo
needs no API key and prints the same thing every time. Tool side effects are real and visible: a
report file and its chart are written, and "sent" emails are appended to an outbox file. The
report tool returns the chart image, so the stored history holds media as well as text.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from stepcore.capability.persistence import StepPersistence
from stepcore.capability.tool_calls import annotate_tool_effect
from stepcore.cli.demo_chart import CHART_FILE, chart_png
from stepcore.recovery.policies import Reconciled, recovery_policy
from stepcore.store.models import ToolEffectRecord
from stepcore.store.step_store import StepStore

__all__ = (
    'CONVERSATION_ID',
    'FIRST_RUN_ID',
    'PROMPT',
    'RESUMED_RUN_ID',
    'DemoAgents',
    'build_agents',
)

PROMPT = 'Prepare the weekly report and email it to the team.'
CONVERSATION_ID = 'weekly-report'
FIRST_RUN_ID = 'report-run-1'
RESUMED_RUN_ID = 'report-run-2'
EMAIL_TO = 'team@example.com'


def _email_key(to: str, subject: str) -> str:
    """The idempotency key of an email: from its arguments, so a reconcile function can derive it too."""
    return f'email::{to}::{subject.lower().replace(" ", "-")}'


REPORT_FILE = 'weekly-report.md'
OUTBOX_FILE = 'outbox.jsonl'

_binary: Callable[..., Any] = BinaryContent  # a pydantic dataclass: its constructor is not visible to type checkers

_FACTS = {
    'releases': 'v2.3 shipped on Tuesday; v2.4 is in review.',
    'incidents': 'one incident: the nightly export ran 40 minutes late.',
}


def _returned_tools(messages: list[ModelMessage]) -> set[str]:
    return {
        part.tool_name
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }


def _tool_return(messages: list[ModelMessage], tool_name: str) -> str:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart) and part.tool_name == tool_name:
                    return part.model_response_str()
    return ''


def assistant_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Research, then write the report, then email it, then say so."""
    del info
    done = _returned_tools(messages)
    if 'ask_researcher' not in done:
        call = ToolCallPart('ask_researcher', {'question': 'What happened this week?'}, tool_call_id='call-research')
        return ModelResponse(parts=[call])
    if 'write_report' not in done:
        findings = _tool_return(messages, 'ask_researcher')
        content = f'# Weekly report\n\n{findings}\n\n![Nightly export times]({CHART_FILE})\n'
        call = ToolCallPart('write_report', {'filename': REPORT_FILE, 'content': content}, tool_call_id='call-write')
        return ModelResponse(parts=[call])
    if 'send_email' not in done:
        args = {'to': EMAIL_TO, 'subject': 'Weekly report', 'attachment': REPORT_FILE}
        return ModelResponse(parts=[ToolCallPart('send_email', args, tool_call_id='call-email')])
    return ModelResponse(parts=[TextPart(f'The weekly report is written and was emailed to {EMAIL_TO}.')])


def researcher_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Look up two topics, then summarise them."""
    del info
    looked_up = [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]
    topics = list(_FACTS)
    if len(looked_up) < len(topics):
        topic = topics[len(looked_up)]
        return ModelResponse(parts=[ToolCallPart('lookup', {'topic': topic}, tool_call_id=f'call-lookup-{topic}')])
    summary = ' '.join(part.model_response_str() for part in looked_up)
    return ModelResponse(parts=[TextPart(summary)])


@dataclass
class DemoAgents:
    assistant: Agent[None, str]
    researcher: Agent[None, str]


def build_agents(
    store: StepStore,
    workdir: Path,
    *,
    say: Callable[[str], None],
    hang_marker: Path | None = None,
) -> DemoAgents:
    """The two agents, persisted to `store`, with tools acting inside `workdir`.

    With `hang_marker`, `send_email` writes that file once the email is in the outbox and then waits
    forever, for the parent process to kill it mid tool call: the email went out, the ledger cannot
    tell. Its recovery policy reconciles with the outbox when the run is resumed.
    """

    def lookup(topic: str) -> str:
        """Look up what happened this week on a topic."""
        say(f'researcher looked up {topic!r}')
        return _FACTS.get(topic, 'nothing recorded')

    researcher = Agent(
        FunctionModel(researcher_model, model_name='scripted-researcher'),
        name='researcher',
        output_type=str,
        tools=[Tool(lookup)],
        capabilities=[StepPersistence(store=store)],
    )

    async def ask_researcher(ctx: RunContext[None], question: str) -> str:
        """Delegate a question to the researcher agent."""
        say(f'assistant delegated to the researcher: {question!r}')
        result = await researcher.run(question, run_id=f'{ctx.run_id}.research')
        return result.output

    def write_report(filename: str, content: str) -> list[str | BinaryContent]:
        """Write the report file and its chart of the nightly export times; return the chart to look at."""
        path = workdir / filename
        path.write_text(content, encoding='utf-8')
        chart = chart_png()
        (workdir / CHART_FILE).write_bytes(chart)
        say(f'wrote {filename} ({len(content)} bytes) and {CHART_FILE} ({len(chart)} bytes)')
        image: BinaryContent = _binary(chart, media_type='image/png')
        return [f'wrote {filename} with the chart {CHART_FILE}', image]

    outbox = workdir / OUTBOX_FILE

    def email_sent(entry: ToolEffectRecord) -> Reconciled | None:
        """Reconcile a send_email cut short by a crash: the outbox tells whether the email went out."""
        key = _email_key(entry.args['to'], entry.args['subject'])
        sent = outbox.read_text(encoding='utf-8').splitlines() if outbox.exists() else []
        if any(json.loads(line)['key'] == key for line in sent):
            say(f'reconciled {entry.tool_name} ({entry.tool_call_id}): the outbox holds {key}, so it is not sent again')
            return Reconciled(f'sent to {entry.args["to"]}')
        say(f'reconciled {entry.tool_name} ({entry.tool_call_id}): no {key} in the outbox, so it runs again')
        return None

    @recovery_policy(email_sent)
    async def send_email(ctx: RunContext[None], to: str, subject: str, attachment: str) -> str:
        """Email the report."""
        key = _email_key(to, subject)
        await annotate_tool_effect(store, ctx, idempotency_key=key, effect_summary=f'email {subject!r} to {to}')
        with outbox.open('a', encoding='utf-8') as f:
            f.write(json.dumps({'key': key, 'to': to, 'subject': subject, 'attachment': attachment}) + '\n')
        say(f'sent email to {to}: {subject!r} with {attachment} attached')
        if hang_marker is not None:
            hang_marker.write_text('in send_email\n', encoding='utf-8')
            await asyncio.Event().wait()  # the parent kills the process here: sent, but not yet recorded
        return f'sent to {to}'

    assistant = Agent(
        FunctionModel(assistant_model, model_name='scripted-assistant'),
        name='assistant',
        deps_type=type(None),
        output_type=str,
        tools=[Tool(ask_researcher), Tool(write_report), Tool(send_email)],
        capabilities=[StepPersistence(store=store)],
    )

    return DemoAgents(assistant=assistant, researcher=researcher)
