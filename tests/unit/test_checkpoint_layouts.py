"""app/domain/checkpoint_layouts.py: which layout a listing is, which checkpoint the framework resumes from, the
rollback plan, and every refusal (pure: listings are built by hand)."""

from __future__ import annotations

import pytest

from app.domain.checkpoint_layouts import (
    QUARANTINE_DIR,
    Layout,
    LayoutRefused,
    Listing,
    Rollback,
    detect,
    parse_dcp_dirs,
    parse_entries,
    plan_rollback,
)

STAMP = "20261202T030000Z"


def listing(entries: dict[str, str], dcp: tuple[str, ...] = (), **trackers: str) -> Listing:
    named = {name.replace("_txt", ".txt"): value for name, value in trackers.items()}
    return Listing(entries, frozenset(dcp), named)


def test_deepspeed_latest_moves_to_the_previous_tag() -> None:
    found = listing(
        {
            "latest": "f",
            "zero_to_fp32.py": "f",
            "global_step9": "d",
            "global_step10": "d",
            "global_step8": "d",
        },
        latest="global_step10",
    )
    assert plan_rollback(found, STAMP) == Rollback(
        Layout.DEEPSPEED,
        current="global_step10",
        previous="global_step9",  # by number, not by name: global_step10 > global_step9
        quarantined=f"{QUARANTINE_DIR}/global_step10.{STAMP}",
        tracker="latest",
        tracker_content="global_step9",
    )


def test_deepspeed_rolls_back_from_the_tag_latest_names_even_when_a_newer_one_exists() -> None:
    found = listing(
        {"latest": "f", "global_step1": "d", "global_step2": "d", "global_step3": "d"},
        latest="global_step2\n",
    )
    plan = plan_rollback(found, STAMP)
    assert (plan.current, plan.previous) == ("global_step2", "global_step1")


def test_megatron_tracker_names_the_previous_iteration() -> None:
    found = listing(
        {"latest_checkpointed_iteration.txt": "f", "iter_0000100": "d", "iter_0000200": "d"},
        latest_checkpointed_iteration_txt="200",
    )
    plan = plan_rollback(found, STAMP)
    assert (plan.layout, plan.current, plan.previous) == (Layout.MEGATRON, "iter_0000200", "iter_0000100")
    assert (plan.tracker, plan.tracker_content) == ("latest_checkpointed_iteration.txt", "100")


def test_huggingface_and_dcp_need_no_tracker() -> None:
    hf = listing({"checkpoint-500": "d", "checkpoint-1000": "d", "runs": "d", "checkpoint-1500": "l"})
    plan = plan_rollback(hf, STAMP)
    # A symlink is never a candidate; the largest real directory is current.
    assert (plan.layout, plan.current, plan.previous, plan.tracker) == (
        Layout.HUGGINGFACE, "checkpoint-1000", "checkpoint-500", None,
    )  # fmt: skip
    dcp = listing({"step-10": "d", "step-20": "d", "step-30": "d"}, dcp=("step-10", "step-20"))
    plan = plan_rollback(dcp, STAMP)  # step-30 has no .metadata: an unfinished save, not a checkpoint
    assert (plan.layout, plan.current, plan.previous) == (Layout.DCP, "step-20", "step-10")


def test_earlier_quarantines_are_not_candidates() -> None:
    found = listing({"checkpoint-1": "d", "checkpoint-2": "d", QUARANTINE_DIR: "d"})
    assert plan_rollback(found, STAMP).current == "checkpoint-2"


@pytest.mark.parametrize(
    ("found", "message"),
    [
        (listing({"step_000100": "d", "notes.txt": "f"}), "no checkpoint layout recognised"),
        (listing({}), "found nothing"),
        (
            listing({"latest": "f", "checkpoint-1": "d", "global_step1": "d"}, latest="global_step1"),
            "several checkpoint layouts in one directory (deepspeed, huggingface)",
        ),
        (
            listing({"latest": "f", "global_step1": "d"}, latest="global_step7"),
            "'latest' names 'global_step7'",
        ),
        (listing({"latest": "f", "global_step1": "d"}, latest="../../etc"), "not a checkpoint name"),
        (listing({"latest": "f", "global_step1": "d"}), "latest could not be read"),
        (listing({"latest": "f", "global_step1": "d"}, latest="global_step1"), "is the only checkpoint"),
        (
            listing(
                {"latest_checkpointed_iteration.txt": "f", "release": "d"},
                latest_checkpointed_iteration_txt="release",
            ),
            "says 'release'",
        ),
        (
            listing(
                {"latest_checkpointed_iteration.txt": "f", "iter_0000001": "d"},
                latest_checkpointed_iteration_txt="5",
            ),
            "names iter_0000005, which is not here",
        ),
        (listing({"final": "d", "step-1": "d"}, dcp=("final", "step-1")), "without a step number (final)"),
    ],
)
def test_refusals_say_what_was_found(found: Listing, message: str) -> None:
    with pytest.raises(LayoutRefused, match=None) as caught:
        plan_rollback(found, STAMP)
    assert message in str(caught.value)


def test_parsers_of_the_find_output() -> None:
    assert parse_entries("d global_step1\0f latest\0l link\0") == {
        "global_step1": "d",
        "latest": "f",
        "link": "l",
    }
    assert parse_dcp_dirs("step-1/.metadata\0step-2/.metadata\0") == frozenset({"step-1", "step-2"})
    assert detect(listing({"checkpoint-3": "d"})) is Layout.HUGGINGFACE
