"""An agent run with a large image persists through FileStepStore with its media in S3, and restores."""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable
from pathlib import Path
from typing import cast

from pydantic_ai import Agent
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_file import FileStepStore
from stepcore import StepPersistence
from stepcore.media import media_uri

from .conftest import S3Server

MiB = 1024 * 1024

# pyright reads BinaryContent as a bare pydantic dataclass: build and read it through typed helpers.
make_binary = cast(Callable[..., BinaryContent], BinaryContent)
data_of = cast(Callable[[BinaryContent], bytes], operator.attrgetter('data'))
media_type_of = cast(Callable[[BinaryContent], str], operator.attrgetter('media_type'))


def image_bytes(size: int) -> bytes:
    header = b'\x89PNG\r\n\x1a\n'
    block = hashlib.sha256(b'large image').digest() * 4096  # 128 KiB
    return header + (block * (size // len(block) + 1))[: size - len(header)]


def describe(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    prompt = messages[0]
    assert isinstance(prompt, ModelRequest)
    part = prompt.parts[-1]
    assert isinstance(part, UserPromptPart)
    images = [item for item in part.content if isinstance(item, BinaryContent)]
    return ModelResponse(parts=[TextPart(f'{len(images)} image of {len(data_of(images[0]))} bytes')])


async def test_agent_run_with_large_image_round_trips_through_s3(tmp_path: Path, s3_server: S3Server) -> None:
    image = image_bytes(6 * MiB)
    directory = tmp_path / 'runs'
    prefix = f'agent-run/{tmp_path.name}/'
    media = s3_server.store(key_prefix=prefix, multipart_threshold_bytes=5 * MiB, multipart_part_bytes=5 * MiB)
    store = FileStepStore(directory, media_store=media)
    run_id = 'vision-run-1'
    agent = Agent(
        FunctionModel(describe), deps_type=type(None), capabilities=[StepPersistence[None](store=store, run_id=run_id)]
    )
    try:
        result = await agent.run(['What is in this picture?', make_binary(data=image, media_type='image/png')])
        assert result.output == f'1 image of {len(image)} bytes'
    finally:
        await store.aclose()
        await media.aclose()

    # The image went to the bucket as one object; the run directory holds only a reference to it.
    on_disk = sum(path.stat().st_size for path in directory.rglob('*') if path.is_file())
    assert on_disk < 256 * 1024
    uri = media_uri(image)
    assert not any(image[:4096] in path.read_bytes() for path in directory.rglob('*') if path.is_file())

    # A new process would build both stores afresh: restore from them.
    reader_media = s3_server.store(key_prefix=prefix)
    reader = FileStepStore(directory, media_store=reader_media)
    try:
        assert await reader_media.exists(uri)
        snapshot = await reader.latest_snapshot(run_id)
        assert snapshot is not None
        assert [type(message) for message in snapshot.messages] == [ModelRequest, ModelResponse]
        prompt = snapshot.messages[0]
        assert isinstance(prompt, ModelRequest)
        user = prompt.parts[-1]
        assert isinstance(user, UserPromptPart)
        assert not isinstance(user.content, str)
        restored = [item for item in user.content if isinstance(item, BinaryContent)]
        assert len(restored) == 1
        assert media_type_of(restored[0]) == 'image/png'
        assert data_of(restored[0]) == image
        response = snapshot.messages[1]
        assert isinstance(response, ModelResponse)
        assert response.parts == [TextPart(f'1 image of {len(image)} bytes')]
    finally:
        await reader.aclose()
        await reader_media.aclose()
