"""The pure half of kubernetes.checkpoint_rollback (app/actions/kubernetes_rollback.py): the volume that holds a
checkpoint directory in a training job's templates, and the read Job's report."""

from __future__ import annotations

import base64

import pytest

from app.actions.kubernetes_rollback import mount_of, parse_report, pod_templates
from app.domain.checkpoint_layouts import LayoutRefused


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def template(
    mounts: list[dict], volumes: list[dict], pod_user: dict | None = None, user: dict | None = None
) -> dict:
    container = {"name": "c", "image": "train:1", "volumeMounts": mounts, "securityContext": user or {}}
    return {"spec": {"securityContext": pod_user or {}, "containers": [container], "volumes": volumes}}


def test_the_deepest_mount_holding_the_directory_wins_with_its_containers_user() -> None:
    nfs = {"name": "shared", "nfs": {"server": "nas", "path": "/export"}}
    claim = {"name": "ckpt", "persistentVolumeClaim": {"claimName": "llama-ckpt"}}
    found = mount_of(
        "/data/checkpoints/llama",
        [template([{"name": "shared", "mountPath": "/data"}, {"name": "ckpt", "mountPath": "/data/checkpoints/"}],
                  [nfs, claim], pod_user={"runAsUser": 1000, "fsGroup": 7}, user={"runAsUser": 2000})],
    )  # fmt: skip

    assert found is not None
    assert (found.volume, found.mount_path, found.image) == (claim, "/data/checkpoints", "train:1")
    assert found.run_as == {"runAsUser": 2000, "fsGroup": 7}


@pytest.mark.parametrize("directory", ["/datasets/x", "/checkpoints-old/llama", "/"])
def test_a_directory_outside_every_mount_has_none(directory: str) -> None:
    mounts = [{"name": "ckpt", "mountPath": "/checkpoints"}]
    assert mount_of(directory, [template(mounts, [{"name": "ckpt", "emptyDir": {}}])]) is None


def test_a_mount_of_a_volume_the_pod_does_not_declare_is_no_mount() -> None:
    assert mount_of("/checkpoints/x", [template([{"name": "gone", "mountPath": "/checkpoints"}], [])]) is None


def test_the_templates_of_each_kind() -> None:
    pod = {"spec": {"containers": []}}
    assert pod_templates("PyTorchJob", {"spec": {"pytorchReplicaSpecs": {"Master": {"template": pod}}}}) == [
        pod
    ]
    assert pod_templates(
        "JobSet", {"spec": {"replicatedJobs": [{"template": {"spec": {"template": pod}}}]}}
    ) == [pod]
    assert pod_templates("Job", {"spec": {"template": pod}}) == [pod]
    assert pod_templates("TrainJob", {"spec": {"runtimeRef": {"name": "torch"}}}) == []


def test_a_report_gives_the_resolved_paths_and_the_listing() -> None:
    text = "\n".join([
        f"resolved {b64('/ckpt/llama')}", f"root {b64('/ckpt')}", f"root {b64('/scratch')}",
        f"entries {b64('d global_step10' + chr(0) + 'd global_step20' + chr(0) + 'f latest' + chr(0))}",
        f"dcp {b64('')}", f"tracker {b64('latest')} {b64('global_step20')}", "end",
    ])  # fmt: skip

    report = parse_report(text)

    assert (report.resolved, report.roots) == ("/ckpt/llama", ("/ckpt", "/scratch"))
    assert report.listing.entries == {"global_step10": "d", "global_step20": "d", "latest": "f"}
    assert report.listing.trackers == {"latest": "global_step20"}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (f"error {b64('cannot resolve /ckpt/x')}\n", "cannot resolve /ckpt/x"),
        (f"resolved {b64('/ckpt/llama')}\nentries {b64('d a')}", "the listing is incomplete"),  # cut: no end
        ("resolved !!!\nend\n", "unreadable listing"),
        ("", "the listing is incomplete"),
    ],
)
def test_a_report_that_says_why_or_was_cut_is_refused(text: str, reason: str) -> None:
    with pytest.raises(LayoutRefused, match=reason):
        parse_report(text)
