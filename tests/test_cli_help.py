"""`python -m chain --help` is chain's own help, Hydra's stays reachable, and a mistyped key or
option is answered with the nearest one ("did you mean")."""

import importlib.util
import os
import re
from pathlib import Path

import pytest

import chain
from chain.config.hydra import dotted_keys, group_options, GROUPS
from chain.config.schema import MODES
from chain.schedule.schedules import NAMES as SCHEDULES

ROOT = Path(__file__).resolve().parents[1]


def test_help_is_chains_own_and_every_name_in_it_exists(cli, tmp_path):
    r = cli("--help")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    text = r.stdout
    assert "== Config ==" not in text and "powered by Hydra" not in text  # not Hydra's page
    assert "--hydra-help" in text and "--cfg job" in text
    for mode in MODES:
        assert re.search(rf"^\s+{mode}\s", text, re.M), mode  # each mode explained on a line of its own
    assert all(name in text for name in (*SCHEDULES, "file")), SCHEDULES
    for group in GROUPS:  # the groups' options, as Hydra lists them from the packaged configs
        assert f"{group}: {', '.join(group_options(group))}" in text
    for command in re.findall(r"python -m (chain\.\w+)", text):  # each command named exists
        assert importlib.util.find_spec(command) is not None, command
    assert {"chain.report", "chain.restage", "chain.worker"} <= set(re.findall(r"python -m (chain\.\w+)", text))
    for page in re.findall(r"(docs/[\w-]+\.md)", text) + ["docs/index.md", "docs/config.md"]:
        assert page in text and (ROOT / page).is_file(), page
    # Every KEY=... the help shows is a key of the config (or a group, +stages, +variants).
    from omegaconf import OmegaConf

    from chain.config.hydra import compose_config

    keys = set(dotted_keys(OmegaConf.to_container(compose_config([], with_hydra=False), resolve=False)))
    shown = set(re.findall(r"(?<![\w.])\+?([a-z_]+(?:\.[a-z_]+)*)=", text))
    assert {
        "stages",
        "mode",
        "trainer.steps",
        "pipeline.schedule",
        "pipeline.microbatches",
        "plan_only",
        "resume",
        "report",
    } <= shown
    unknown = shown - keys - {"stages", "variants", "hydra.run.dir", "group"}  # group=option: the groups
    assert not unknown, unknown
    assert not os.path.exists(tmp_path / "outputs")  # nothing written


def test_hydra_help_stays_reachable(cli):
    r = cli("--hydra-help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Hydra (") and "--multirun" in r.stdout and "--cfg" in r.stdout


@pytest.mark.parametrize(
    "override, hint",
    [
        ("trainer.stpes=10", "did you mean trainer.steps?"),  # Hydra refuses it (the key is not there)
        ("+trainer.stepz=5", "did you mean trainer.steps?"),  # Hydra adds it, the schema refuses it
        ("steps=10", "did you mean trainer.steps?"),  # a key of a section, given at the top
        ("trainer.lr=0.1", "did you mean optim.lr?"),
        ("+stages=[{modle: {width: 3}}]", "did you mean stages[0].model?"),
        ("model=mlpp", "did you mean model=mlp?"),  # a group's option
        ("precision=float16", "did you mean precision=mixed_float16?"),  # a key's allowed values
    ],
)
def test_a_mistyped_key_or_option_names_the_nearest(override, hint):
    with pytest.raises(chain.ConfigError) as e:
        chain.compose([override])
    line = str(e.value)
    assert line.endswith("; " + hint) and "\n" not in line, line
    assert line.count("did you mean") == 1


@pytest.mark.parametrize("override", ["xyz=1", "mode=magic"])
def test_nothing_near_is_no_guess(override):
    with pytest.raises(chain.ConfigError) as e:
        chain.compose([override])
    assert "did you mean" not in str(e.value) and "allowed" in str(e.value)


def test_the_readmes_unknown_key_line_is_what_the_program_says():
    """README's "Bad input" block shows the whole line (every allowed key, then the nearest)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    at = lines.index("$ python -m chain +trainer.stepz=5")
    with pytest.raises(chain.ConfigError) as e:
        chain.compose(["+trainer.stepz=5"])
    assert lines[at + 1] == f"error: {e.value}" and "did you mean trainer.steps?" in lines[at + 1]
