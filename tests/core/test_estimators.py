"""The estimator registry: each estimator declares its options once, and dispatch enforces the declaration."""

from __future__ import annotations

import dataclasses
import inspect
import math
import subprocess
import sys
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_otb import ESTIMATORS, InfiniteRewardWarning, compute_advantages, otb_advantages
from trl_otb.core import Estimator, register_estimator

SETTINGS = settings(deadline=None, max_examples=80, derandomize=True)

# A value each option accepts, that changes the result of the estimators that take it (on INPUTS below).
OPTION_VALUES = {
    "eps": 1e-3,
    "tail": "none",
    "is_weights": torch.tensor([[1.5], [1.0], [0.5], [1.2]]),
    "align": "valid",
    "leave_one_out": True,
    "scale": "group",
}
INPUTS = dict(
    rewards=torch.tensor([1.0, 0.0, 2.0, 0.5]),
    proxy=torch.tensor([[0.5, 1.0, 0.2], [1.0, 1.0, 1.0], [2.0, 0.1, 0.3], [0.7, 0.4, 1.1]]),
    mask=torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 1], [1, 1, 0]]),
    group_ids=torch.tensor([0, 0, 0, 0]),
)


def test_registered_names_are_the_keys_and_options_are_the_keyword_parameters():
    assert list(ESTIMATORS) == ["otb", "grpo", "rloo", "opo", "ogb"]
    for name, estimator in ESTIMATORS.items():
        assert isinstance(estimator, Estimator) and estimator.name == name
        assert isinstance(estimator.options, frozenset)
        params = inspect.signature(estimator.fn).parameters.values()
        assert estimator.options == {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(OPTION_VALUES) == set().union(*(e.options for e in ESTIMATORS.values()))


def test_declared_attributes():
    assert {n for n, e in ESTIMATORS.items() if e.uses_proxy} == {"otb", "ogb"}
    assert {n for n, e in ESTIMATORS.items() if e.token_level} == {"otb"}
    assert ESTIMATORS["otb"].options == {"eps", "tail", "is_weights", "align", "leave_one_out"}
    assert ESTIMATORS["grpo"].options == {"scale"} and ESTIMATORS["ogb"].options == {"eps", "is_weights"}
    assert ESTIMATORS["rloo"].options == ESTIMATORS["opo"].options == frozenset()


def test_an_estimator_is_frozen_and_callable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ESTIMATORS["otb"].options = frozenset()
    got = ESTIMATORS["otb"](*INPUTS.values(), tail="none", leave_one_out=True)
    assert torch.equal(got, otb_advantages(**INPUTS, tail="none", leave_one_out=True))


@SETTINGS
@given(
    name=st.sampled_from(sorted(ESTIMATORS)),
    chosen=st.sets(st.sampled_from([*sorted(OPTION_VALUES), "bogus"])),
)
def test_each_estimator_accepts_exactly_its_declared_options(name, chosen):
    estimator = ESTIMATORS[name]
    options = {k: OPTION_VALUES.get(k, 1) for k in chosen}
    foreign = chosen - estimator.options
    if not foreign:
        got = compute_advantages(name, **INPUTS, **options)
        assert torch.equal(got, estimator.fn(**INPUTS, **options))
        return
    with pytest.raises(TypeError) as info:
        compute_advantages(name, **INPUTS, **options)
    message = str(info.value)
    assert repr(name) in message and repr(sorted(foreign)) in message
    assert (repr(sorted(estimator.options)) if estimator.options else "no options") in message


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_each_declared_option_reaches_the_estimator(name):
    """Every declared option changes the result: it is passed on, not dropped."""
    plain = compute_advantages(name, **INPUTS)
    for option in ESTIMATORS[name].options:
        assert not torch.allclose(compute_advantages(name, **INPUTS, **{option: OPTION_VALUES[option]}), plain), option


@SETTINGS
@given(name=st.sampled_from(sorted(ESTIMATORS)), data=st.data())
def test_uses_proxy_and_token_level_are_what_the_estimator_does(name, data):
    """uses_proxy=False: the proxy cannot change the advantages. token_level=False: one value per sequence."""
    B, T = 6, 5
    floats = st.floats(0.0, 2.0, allow_nan=False, width=32)
    proxy = torch.tensor(data.draw(st.lists(floats, min_size=B * T, max_size=B * T))).view(B, T)
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T))).view(B, T)
    rewards = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=B, max_size=B)))
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1])
    estimator = ESTIMATORS[name]
    adv = estimator(rewards, proxy, mask, group_ids)
    if not estimator.uses_proxy:
        assert torch.equal(adv, estimator(rewards, torch.ones(B, T), mask, group_ids))
    if not estimator.token_level:
        for row, m in zip(adv, mask):
            assert torch.all(row[m] == row[m][:1]) and torch.all(row[~m] == 0)


def test_registering_checks_the_declaration_and_unknown_names_list_the_choices():
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("otb", uses_proxy=True, token_level=True)(otb_advantages)

    def halves(rewards, proxy, mask, group_ids, *, factor=0.5):
        return factor * rewards[:, None] * mask

    with pytest.raises(TypeError, match=r"\['factor'\]"):
        register_estimator("halves", options=("scale",), uses_proxy=False, token_level=False)(halves)
    assert "halves" not in ESTIMATORS
    try:
        assert register_estimator("halves", options=("factor",), uses_proxy=False, token_level=False)(halves) is halves
        got = compute_advantages("halves", **INPUTS, factor=2.0)
        assert torch.equal(got, 2.0 * INPUTS["rewards"][:, None] * INPUTS["mask"])
        with pytest.raises(TypeError, match="'halves'"):
            compute_advantages("halves", **INPUTS, scale="group")
    finally:
        ESTIMATORS.pop("halves", None)
    with pytest.raises(ValueError, match="choose one of") as info:
        compute_advantages("ppo", **INPUTS)
    assert all(repr(name) in str(info.value) for name in ESTIMATORS)


def test_the_core_imports_torch_only():
    """trl_otb.core (and the top-level names that come from it) load without TRL, transformers or accelerate."""
    code = (
        "import sys, trl_otb, trl_otb.core; "
        "print(sorted(m for m in ('trl', 'transformers', 'accelerate', 'datasets') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_infinite_rewards_are_excluded_like_nan_but_warned(name):
    rewards = torch.tensor([1.0, math.inf, 0.0, 2.0])
    with pytest.warns(InfiniteRewardWarning, match=r"1 of 4 rewards are infinite \(rows \[1\]\)"):
        got = compute_advantages(name, rewards, INPUTS["proxy"], INPUTS["mask"], INPUTS["group_ids"])
    assert (got[1] == 0).all()
    as_nan = compute_advantages(
        name, rewards.nan_to_num(posinf=math.nan), INPUTS["proxy"], INPUTS["mask"], INPUTS["group_ids"]
    )
    assert torch.equal(got, as_nan)


def test_finite_rewards_raise_no_infinite_reward_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", InfiniteRewardWarning)
        otb_advantages(**INPUTS)


# The library's entry points: they may import the demo (the embedded model) and the plots.
ENTRY_POINTS = ("trl_otb.cli", "trl_otb.fidelity.cli")
DEMO_AND_HELPERS = ("trl_otb.recipes", "trl_otb.testing")

LIBRARY_IMPORTS = f"""
import importlib, sys
from pathlib import Path

def loaded(*prefixes):
    return sorted(name for name in sys.modules if name.startswith(prefixes))

import trl_otb, trl_otb.trainer
print(loaded(*{DEMO_AND_HELPERS}, *{ENTRY_POINTS}, "trl_otb.plotting", "matplotlib"))
print(loaded("trl_otb.card", "trl_otb.bnb", "trl_otb.fidelity.training"))
root = Path(trl_otb.__file__).parent
modules = [".".join(("trl_otb", *path.relative_to(root).with_suffix("").parts)) for path in root.rglob("*.py")]
library = [
    name.removesuffix(".__init__") for name in sorted(modules)
    if not name.startswith({DEMO_AND_HELPERS}) and name not in {ENTRY_POINTS}
]
for name in library:
    importlib.import_module(name)
print(len(library), loaded(*{DEMO_AND_HELPERS}))
"""


def test_the_library_imports_neither_the_demo_nor_the_test_helpers():
    """Every module of trl_otb outside recipes/ and testing/ (the entry points aside) loads no trl_otb.recipes or
    trl_otb.testing module; ``trl_otb.trainer`` loads neither the commands nor plotting (matplotlib)."""
    result = subprocess.run([sys.executable, "-c", LIBRARY_IMPORTS], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    by_trainer, trainers_own, library = result.stdout.splitlines()
    assert by_trainer == "[]"
    assert trainers_own == "['trl_otb.bnb', 'trl_otb.card', 'trl_otb.fidelity.training']"  # the import did happen
    count, demo_or_helpers = library.split(" ", 1)
    assert int(count) >= 20 and demo_or_helpers == "[]", library


def _package_imports() -> dict[str, set[str]]:
    """trl_otb module -> the trl_otb modules it imports anywhere in its source (function bodies too)."""
    import ast
    from pathlib import Path

    import trl_otb

    root = Path(trl_otb.__file__).parent
    names = {}
    for path in root.rglob("*.py"):
        parts = ("trl_otb", *path.relative_to(root).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = (path, parts[-1] == "__init__")
    graph = {}
    for name, (path, is_package) in names.items():
        package = name if is_package else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                if not name.startswith(module + "."):  # a parent package is loaded before its modules anyway
                    found.add(module)
                found.update(f"{module}.{alias.name}" for alias in node.names)
        graph[name] = {other for other in found if other in names and other != name}
    return graph


def test_the_package_has_no_import_cycle():
    graph = _package_imports()
    assert "trl_otb.recipes.hub" in graph["trl_otb.recipes.models"]  # the scan sees imports (and this one)
    assert "trl_otb.recipes.models" in graph["trl_otb.fidelity.cli"]  # ...inside functions too
    state, cycles = {}, []

    def visit(module, path):
        state[module] = "open"
        for other in sorted(graph[module]):
            if state.get(other) == "open":
                cycles.append([*path[path.index(other) :], other])
            elif other not in state:
                visit(other, [*path, other])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []
