"""Fixtures for the E2B compatibility scenarios.

The SDKs are pointed at a local corral daemon only through E2B_API_URL, E2B_SANDBOX_URL and
E2B_API_KEY (set by scripts/e2b-tests.sh); nothing below knows it is not talking to E2B.
"""

import os

import pytest
import pytest_asyncio
from e2b import AsyncSandbox, Sandbox
from e2b_code_interpreter import AsyncSandbox as AsyncCodeSandbox
from e2b_code_interpreter import Sandbox as CodeSandbox

for variable in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"):
    if not os.environ.get(variable):
        raise RuntimeError(f"{variable} must be set (run scripts/e2b-tests.sh)")


@pytest.fixture
def sandbox():
    sbx = Sandbox.create(timeout=120, metadata={"suite": "e2b-tests"})
    try:
        yield sbx
    finally:
        sbx.kill()


@pytest.fixture
def code_sandbox():
    sbx = CodeSandbox.create(timeout=120)
    try:
        yield sbx
    finally:
        sbx.kill()


@pytest_asyncio.fixture
async def async_sandbox():
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        yield sbx
    finally:
        await sbx.kill()


@pytest_asyncio.fixture
async def async_code_sandbox():
    sbx = await AsyncCodeSandbox.create(timeout=120)
    try:
        yield sbx
    finally:
        await sbx.kill()
