"""The numerics guard's finite check: one sum per tensor sees every NaN and Inf."""

import numpy as np
import pytest
import tensorflow as tf

from chain.steps.numerics import all_finite


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, "both infinities"])
@pytest.mark.parametrize("where", [0, 1, 4095, 65535, (1 << 20) - 1])
def test_one_bad_element_anywhere_in_a_large_gradient_is_seen(bad, where):
    g = np.random.default_rng(0).standard_normal(1 << 20).astype("float32")
    if bad == "both infinities":  # their sum is NaN, never a finite number
        g[where], g[-1 - where] = np.inf, -np.inf
    else:
        g[where] = bad
    ok = [tf.ones([3, 4]), tf.zeros([5])]
    assert not bool(all_finite(tf.constant(1.0), ok + [tf.constant(g.reshape(1024, 1024))]))
    assert not bool(tf.function(all_finite)(None, [tf.constant(g), None] + ok))


def test_finite_gradients_and_loss_pass():
    g = [tf.random.normal([256, 256]) * 1e6, tf.constant([-3.0e30, 3.0e30]), None]
    assert bool(all_finite(tf.constant(2.0), g))
    assert bool(all_finite(None, []))
    assert not bool(all_finite(tf.constant(np.nan), g))
    # The documented difference from an elementwise check: a float32 sum that overflows.
    assert not bool(all_finite(None, [tf.fill([4], 3.0e38)]))
