"""trl_otb.demo.hub: the offline switch (read as huggingface_hub reads it, shared with the model loader) and the Hub
pre-flight, without network: HfApi.whoami and the token lookup are monkeypatched."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from trl_otb import models
from trl_otb.demo.hub import HubPreflightError, hub_offline, preflight_hub
from trl_otb.demo.models import EMBEDDED_HUB_ID, resolve_model

# (environment, offline): huggingface_hub reads HF_HUB_OFFLINE, or TRANSFORMERS_OFFLINE when that is unset or empty.
HUB_SWITCHES = [
    ({}, False),
    ({"HF_HUB_OFFLINE": "1"}, True),
    ({"HF_HUB_OFFLINE": "yes"}, True),
    ({"HF_HUB_OFFLINE": "True"}, True),
    ({"HF_HUB_OFFLINE": "on"}, True),
    ({"HF_HUB_OFFLINE": "0"}, False),
    ({"HF_HUB_OFFLINE": "false"}, False),
    ({"TRANSFORMERS_OFFLINE": "1"}, True),
    ({"HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": "1"}, True),
    ({"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"}, False),
]


def _hub_switches(monkeypatch, env, constant=False):
    import huggingface_hub

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", constant)  # what it read at import


@pytest.mark.parametrize(("env", "offline"), HUB_SWITCHES)
def test_hub_offline_reads_the_environment_now(env, offline, monkeypatch):
    _hub_switches(monkeypatch, env)
    assert hub_offline() is offline


def test_hub_offline_agrees_with_huggingface_hub_reading_the_same_environment():
    """huggingface_hub's own parse (at import, in a fresh interpreter per case) gives the same answers."""
    script = (
        "import importlib, json, os, sys\n"
        "import huggingface_hub.constants as c\n"
        "out = []\n"
        "for env in json.loads(sys.argv[1]):\n"
        "    for name in ('HF_HUB_OFFLINE', 'TRANSFORMERS_OFFLINE'):\n"
        "        os.environ.pop(name, None)\n"
        "    os.environ.update(env)\n"
        "    out.append(importlib.reload(c).HF_HUB_OFFLINE)\n"
        "print(json.dumps(out))\n"
    )
    cases = json.dumps([env for env, _ in HUB_SWITCHES])
    result = subprocess.run([sys.executable, "-c", script, cases], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == [offline for _, offline in HUB_SWITCHES]


def test_hub_offline_when_huggingface_hub_was_imported_offline(monkeypatch):
    _hub_switches(monkeypatch, {"HF_HUB_OFFLINE": "0"}, constant=True)  # every Hub request would be refused
    assert hub_offline()


def test_the_model_loader_and_the_preflight_share_one_offline_switch(monkeypatch):
    _hub_switches(monkeypatch, {"TRANSFORMERS_OFFLINE": "1"})
    monkeypatch.setattr(models, "embedded_model_path", lambda: "/cache/embedded")
    monkeypatch.setattr(models, "hub_cached", lambda repo_id: False)
    assert resolve_model(EMBEDDED_HUB_ID) == "/cache/embedded"  # offline: the embedded copy
    with pytest.raises(HubPreflightError, match="TRANSFORMERS_OFFLINE"):
        preflight_hub("alice/model", token="hf_test")
    _hub_switches(monkeypatch, {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"})
    assert resolve_model(EMBEDDED_HUB_ID) == EMBEDDED_HUB_ID  # online: the Hub id passes through


@pytest.fixture
def online_hub(monkeypatch):
    """The Hub looks online; whoami answers from ``state`` (a dict, or an exception to raise)."""
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_test")
    state = {"answer": {"name": "alice", "orgs": [{"name": "otb-lab"}], "auth": {"accessToken": {"role": "write"}}}}

    def whoami(self, token=None, **kwargs):
        if isinstance(state["answer"], Exception):
            raise state["answer"]
        return state["answer"]

    monkeypatch.setattr(huggingface_hub.HfApi, "whoami", whoami)
    return state


def test_preflight_refuses_offline_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubPreflightError, match="Unset HF_HUB_OFFLINE"):
        preflight_hub("alice/model", token="hf_test")


def test_preflight_refuses_missing_token(online_hub, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(HubPreflightError, match="hf auth login"):
        preflight_hub("alice/model")


def test_preflight_refuses_a_namespace_the_user_cannot_write(online_hub):
    with pytest.raises(HubPreflightError, match="cannot write to someone-else/model") as excinfo:
        preflight_hub("someone-else/model")
    assert "--hub_model_id alice/model" in str(excinfo.value)


def test_preflight_refuses_a_read_only_token(online_hub):
    online_hub["answer"]["auth"]["accessToken"]["role"] = "read"
    with pytest.raises(HubPreflightError, match="read-only"):
        preflight_hub("alice/model")


def test_preflight_reports_an_unreachable_hub(online_hub):
    online_hub["answer"] = ConnectionError("Name or service not known")
    with pytest.raises(HubPreflightError, match="could not be reached"):
        preflight_hub("alice/model")


def test_preflight_reports_a_rejected_token(online_hub):
    from huggingface_hub.errors import HfHubHTTPError

    response = SimpleNamespace(status_code=401, headers={}, request=None)
    online_hub["answer"] = HfHubHTTPError("401 Unauthorized", response=response)
    with pytest.raises(HubPreflightError, match="rejected"):
        preflight_hub("alice/model")


def test_preflight_accepts_own_and_org_namespaces(online_hub):
    assert preflight_hub("alice/model") == "alice/model"
    assert preflight_hub("otb-lab/model") == "otb-lab/model"
    assert preflight_hub("model") == "alice/model"  # no namespace: the user's
