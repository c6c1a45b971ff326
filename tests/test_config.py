"""The schema: every bad value is one line naming the key; no TensorFlow needed."""

from dataclasses import replace

import pytest

import chain
from messages import says


def test_defaults_two_stages_from_the_template():
    s = chain.compose([])
    assert len(s.stages) == 2
    assert all(st.model == s.model for st in s.stages)


@pytest.mark.parametrize("form", ["+stages=3", "stages=3"])
def test_stages_count_both_spellings(form):
    assert len(chain.compose([form]).stages) == 3


def test_heterogeneous_stages_override_the_template():
    s = chain.compose(["+stages=[{model: conv},{model: {width: 8}},{optim: sgd, target: parity}]"])
    conv, narrow, third = s.stages
    assert conv.model.name == "conv" and not hasattr(conv.model, "width")
    assert narrow.model == replace(s.model, width=8)
    assert third.optim.name == "sgd" and third.target == "parity"
    assert third.model == s.model


@pytest.mark.parametrize(
    "override, message",
    [
        ("+stages=0", "stages=0 must be a positive integer"),
        ("+stages=-2", "stages=-2 must be a positive integer"),
        ("model=transformer", "model='transformer' is not known; allowed: builder, conv, gpt, keras, mlp"),
        ("optim=lion", "optim='lion' is not known; allowed: adam, adamw, sgd, target"),
        (
            "data=imagenet",
            "data='imagenet' is not known; allowed: callable, csv, digits, keras, npz, synthetic, text, tfrecord, tokens",
        ),
        ("optim.lr=0", "optim.lr=0 must be > 0"),
        ("optim.lr=-0.1", "optim.lr=-0.1 must be > 0"),
        ("data.batch_size=0", "data.batch_size=0 must be >= 1"),
        ("mode=magic", "mode='magic' is not known; allowed: local, e2e, side_by_side"),
        ("+trainer.stepz=5", "unknown key trainer.stepz; allowed keys of trainer:"),
        ("+stages=[{modle: {width: 3}}]", "unknown key stages[0].modle"),
        ("+stages=[{model: {name: rnn}}]", "model='rnn' is not known"),
        ("placement.devices=/CPU:0", "placement.devices='/CPU:0' must be a list"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(chain.ConfigError) as e:
        chain.compose([override])
    assert says(str(e.value), message)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["placement.split=[2,2]"], "placement.split is what placement.plan=auto chooses"),
        (["placement.replicas=2"], "placement.replicas is what placement.plan=auto chooses"),
        (["placement.devices=[/CPU:0,/CPU:1]"], "placement.devices is what placement.plan=auto chooses"),
        (["placement.balance=params"], "placement.balance=params: placement.plan=auto cuts the model"),
        (["+stages=[{model: {width: 4}},{}]"], "+stages=[...] gives the stages settings of their own"),
        (["pipeline.schedule=file", "pipeline.schedule_file=x.csv"], "pipeline.schedule=file: placement.plan=auto"),
        (["model=builder", "model._target_=nowhere.fn"], "the user's stage builders (_target_) are not measured"),
        (["placement.fallback=mirrored"], "placement.fallback=mirrored runs the chain whole on each replica"),
        (["data=callable", "data._target_=nowhere.fn"], "which data=callable gives only once TensorFlow reads it"),
    ],
)
def test_what_plan_auto_refuses_is_refused_by_the_configs_checks(overrides, message):
    """placement.plan=auto's refusals are the config's: one line from `chain.compose`, before anything is
    built (they were the build's, after TensorFlow had started)."""
    stages = [] if any(o.startswith("+stages") for o in overrides) else ["+stages=2"]
    with pytest.raises(chain.ConfigError) as e:
        chain.compose(["mode=e2e", "placement.plan=auto", *stages, *overrides])
    assert says(str(e.value), message) and "\n" not in str(e.value)
