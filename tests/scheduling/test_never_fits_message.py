"""A request that never fits says why and points at the page that says which tiers may mix GPU
models (issue 31: a 40-GPU H100 gang "never fits" while a 64-GPU sweep spans A100 and H100 nodes,
and no page said why)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.scheduling.cycle_builders import job
from xirang_platform.scheduling.holds import never_fits_message
from xirang_platform.scheduling.model import Tier

REPO = Path(__file__).resolve().parents[2]


def anchors(markdown: str) -> set[str]:
    """The GitHub anchors of a page's headings (lower case, punctuation dropped, spaces to '-')."""
    headings = re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(job("gang").gpus(40).tier("online-training").build(), id="an online-training gang"),
        pytest.param(job("sweep").gpus(4000).tier("offline-training").build(), id="an offline sweep past the pool"),
        pytest.param(job("replica").gpus(16).tier("inference").build(), id="an inference replica past one node"),
    ],
)
def test_the_never_fits_message_points_at_the_section_on_mixing_models(request_) -> None:  # type: ignore[no-untyped-def]
    message = never_fits_message(request_)
    page, anchor = re.findall(r"(docs/[\w.-]+\.md)#([\w-]+)", message)[0]
    text = (REPO / page).read_text(encoding="utf-8")
    assert anchor in anchors(text)
    section = text.split(re.search(r"^#+ .*mix GPU models.*$", text, flags=re.MULTILINE)[0])[1].split("\n#")[0]
    for tier in Tier:
        assert f"`{tier.value}`" in section  # each tier's rule is on the page the message names
