"""Connection fixtures: every test talks to the MongoDB server named by `STEP_MONGO_URL`.

Start a local one with `export STEP_MONGO_URL="$(scripts/mongo-server.sh start)"`, or point the
variable at any MongoDB (for example `mongodb://127.0.0.1:27017` for a mongo:8 container).
Without a reachable server the tests fail; they never skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import pytest
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from step_mongo.client import Document, MongoClient

URL_VARIABLE = 'STEP_MONGO_URL'
_HOW_TO = (
    'start a local server with `export STEP_MONGO_URL="$(scripts/mongo-server.sh start)"` or set '
    'STEP_MONGO_URL to a MongoDB connection string such as mongodb://127.0.0.1:27017'
)


@pytest.fixture(scope='session')
def mongo_url() -> str:
    url = os.environ.get(URL_VARIABLE)
    if not url:
        pytest.fail(f'{URL_VARIABLE} is not set: the step-mongo tests need a MongoDB server; {_HOW_TO}', pytrace=False)
    return url


@pytest.fixture
async def mongo_client(mongo_url: str) -> AsyncIterator[MongoClient]:
    """A client for the test's own use (stores under test get `db_url=` or this client)."""
    client: MongoClient = AsyncMongoClient[Document](mongo_url, serverSelectionTimeoutMS=5000)
    try:
        await client.admin.command('ping')
    except PyMongoError as error:
        await client.close()
        pytest.fail(
            f'cannot reach the MongoDB server at {URL_VARIABLE}={mongo_url!r}: {error}; {_HOW_TO}', pytrace=False
        )
    yield client
    await client.close()


@pytest.fixture
async def db_name(mongo_client: MongoClient) -> AsyncIterator[str]:
    """A fresh database name, dropped after the test."""
    name = f'stepcore_test_{uuid.uuid4().hex}'
    yield name
    await mongo_client.drop_database(name)
