"""The dashboard's OpenAI try-it in a real browser (Debian's Chromium via Playwright): a chat
model's page streams the answer into its transcript; an embedding model's shows the vector. A
generator (decoupled) chat or completion model's page has only the OpenAI box: the V2 form,
which answers 501 for such a model, is not shown."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import CHROMIUM, chromium, collect_errors
from needs import missing

if not CHROMIUM.exists():
    missing(f"Chromium at {CHROMIUM}", "apt-get install chromium chromium-driver", module=True)

from playwright.sync_api import Page, expect
from servers import ServerProcess, start_server
from test_dashboard import LAPTOP

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "openai"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("openai-dashboard")
    shutil.copy(EXAMPLE / "chargen.py", root / "chargen.py")
    shutil.copy(EXAMPLE / "serve.yaml", root / "serve.yaml")
    spec = importlib.util.spec_from_file_location("build_embedder", EXAMPLE / "build_embedder.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(root / "models")
    process = start_server(root / "serve.yaml", grpc=False)
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture
def page(server: ServerProcess) -> Iterator[Page]:
    with chromium() as browser:
        context = browser.new_context(base_url=server.http_url, viewport=LAPTOP)
        page = context.new_page()
        errors = collect_errors(page)
        yield page
        context.close()
        assert errors == []


def test_chat_try_it_streams_the_answer(page: Page) -> None:
    page.goto("/models/chargen-chat/try")
    section = page.locator("#openai-try")
    expect(section.get_by_role("heading", name="Chat on the OpenAI route")).to_be_visible()
    expect(page.locator("#try-form")).to_have_count(0)  # its predict yields: V2 infer is 501
    page.get_by_label("Message", exact=True).fill("tell me about the cat")
    page.get_by_role("button", name="Send", exact=True).click()
    answer = page.locator('.chat-line[data-role="assistant"][data-done="true"] .chat-text')
    expect(answer).to_have_count(1)
    first = answer.inner_text()
    assert first.strip()
    expect(page.locator('.chat-line[data-role="user"]')).to_have_text("Youtell me about the cat")
    page.get_by_label("Message", exact=True).fill("and the dog")  # a second turn keeps the history
    page.get_by_role("button", name="Send", exact=True).click()
    expect(answer).to_have_count(2)
    expect(page.locator("#openai-error")).to_be_hidden()


def test_embeddings_try_it_shows_the_vector(page: Page) -> None:
    page.goto("/models/embedder/try")
    expect(page.get_by_role("heading", name="Embeddings on the OpenAI route")).to_be_visible()
    page.get_by_label("Text", exact=True).fill("the quick brown fox")
    page.get_by_role("button", name="Embed").click()
    expect(page.locator("#openai-dimensions")).to_have_text("64 dimensions, length 1.0000")
    expect(page.locator("#try-form")).to_be_visible()  # not a generator: the V2 form too


def test_completion_try_it_streams_instead_of_the_v2_form(page: Page) -> None:
    page.goto("/models/chargen/try")  # a generator completion model
    section = page.locator("#openai-try")
    expect(section.get_by_role("heading", name="Completion on the OpenAI route")).to_be_visible()
    expect(page.locator("#try-form")).to_have_count(0)
    page.get_by_label("Prompt", exact=True).fill("the cat")
    page.get_by_role("button", name="Complete", exact=True).click()
    answer = page.locator('.chat-line[data-role="assistant"][data-done="true"] .chat-text')
    expect(answer).to_have_count(1)
    assert answer.inner_text().strip()
    expect(page.locator("#openai-error")).to_be_hidden()
