"""The `tf.data` stream of a streamed data set (`data.stream=true`, `chain.data.shards.Shards`):
records read from their files while training, never gathered into NumPy.

Training: the file names, shuffled per epoch from `seed`; their records read several files at a
time (`interleave`, in parallel, in a deterministic order); each parsed; the examples shuffled in
a buffer of `shuffle_buffer`, batched and prefetched. Host memory holds the buffers, not the data
set. Every stage is checkpointable, so the iterator's state (file positions and the shuffle
buffer's examples) goes into every checkpoint as the in-memory stream's does, and a resumed run
sees the batches it would have seen.

Bad records found mid-run (a missing feature, a feature with more or fewer values than declared)
stop the run with one line naming the file and the record's number in it (`bad_record`, raised by
`chain.training.run.Run.fit`), or, with `data.on_bad_record=skip`, are left out.
"""

from __future__ import annotations

import math
import re

import tensorflow as tf

from chain.data.shards import Shards

CYCLE = 4  # files read at a time: enough to mix files and keep the reader busy, few open buffers


MARK = "chain-bad-record"  # starts the assertion's data, so the host finds it in TensorFlow's message
END = "<end>"  # ends the assertion's reason, which may hold brackets itself
_BAD = re.compile(MARK + r"\]\s*\[(.*?)\]\s*\[(\d+)\]\s*\[(.*?)" + END, re.S)


def _numbered(path) -> tf.data.Dataset:
    """The records of one file, each with its file and its number in the file (for error lines)."""
    return tf.data.TFRecordDataset(path).enumerate().map(lambda i, r: (path, i, r))


def _checked(shards: Shards):
    """(file, number, serialized `tf.train.Example`) -> (x, ys, ok, why): every declared feature
    parsed with whatever number of values it holds, `ok` when each holds as many as declared, `why`
    naming those that do not."""
    features = dict(shards.features)
    spec = {name: tf.io.VarLenFeature(tf.float32 if dtype == "float32" else tf.int64)
            for name, (dtype, _) in features.items()}

    def check(path, i, record):
        ex = tf.io.parse_single_example(record, spec)
        sizes = {name: tf.size(ex[name].values) for name in spec}
        wrong = [tf.where(tf.equal(n, math.prod(features[name][1])), "",
                          tf.strings.join([f"feature {name} holds ", tf.strings.as_string(n),
                                           f" values, declared {_declared(features[name])}; "]))
                 for name, n in sizes.items()]
        ok = tf.reduce_all([tf.equal(n, math.prod(features[name][1])) for name, n in sizes.items()])
        return ex, ok, tf.strings.join(wrong + [END])

    return check


def _declared(feature: tuple) -> str:
    dtype, shape = feature
    return dtype + (f"[{','.join(map(str, shape))}]" if shape else "")


def _examples(records: tf.data.Dataset, shards: Shards, skip: tf.Variable | None) -> tf.data.Dataset:
    """(file, number, record) -> (x float32, {target: int32 label or float32 value}); a bad record
    fails the stream naming its file and number, or (`skip`: a counter) is counted and left out."""
    features, check = dict(shards.features), _checked(shards)

    def dense(ex, ok, why, path, i):
        assertion = [] if skip is not None else [tf.debugging.Assert(ok, [MARK, path, i, why], summarize=1)]
        with tf.control_dependencies(assertion):
            x = tf.cast(tf.reshape(ex[shards.x].values, features[shards.x][1]), tf.float32)
            ys = {name: tf.cast(tf.reshape(ex[key].values, []), tf.int32 if classes else tf.float32)
                  for name, key, classes in shards.targets}
        return x, ys

    checked = records.map(lambda path, i, r: (*check(path, i, r), path, i), num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True)
    if skip is not None:
        def keep(ex, ok, why, path, i):
            with tf.control_dependencies([skip.assign_add(tf.cast(tf.logical_not(ok), tf.int64))]):
                return tf.identity(ok)

        checked = checked.filter(keep)
        # The counter is state outside the stream: a checkpoint saves the stream without it (so a
        # resumed run counts from 0 again), which tf.data refuses unless told.
        options = tf.data.Options()
        options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        checked = checked.with_options(options)
    return checked.map(dense, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def bad_record(error: BaseException, shards: Shards) -> str | None:
    """The one line for a bad record that stopped the stream of `shards` (naming the key whose glob
    matched its file), or None when `error` is not one."""
    key = "data.files" if shards.val_key == "data.files" else "data.files or data.val_files"
    text = str(error)
    found = _BAD.search(text)
    if not found and (isinstance(error, tf.errors.DataLossError) or "Data types don't match" in text):
        said = re.sub(r"\{\{[^}]*\}\}|\[Op:[^\]]*\].*|\s+", " ", text.splitlines()[0] if text else "").strip()
        said = said[said.index("Key: "):] if "Key: " in said else said  # past tf.data's "Error in user-defined ..."
        return (f"{key}: a record cannot be read ({said}): a damaged record, or a feature whose type is not the one "
                "data.features declares; TensorFlow does not say in which file")
    if not found:
        return None
    path, i, why = found.groups()
    return (f"{shards.key(path)}: record {i} of {path} is not as data.features declares it: {why.strip().rstrip(';')} "
            "(data.on_bad_record=skip leaves such records out)")


def skip_counter(shards: Shards) -> tf.Variable | None:
    """The count of bad records left out (`data.on_bad_record=skip`), or None when they stop the run."""
    return tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_records") if shards.skip_bad else None


def training(shards: Shards, batch: int, shuffle: bool, seed: int, skipped: tf.Variable | None = None
             ) -> tf.data.Dataset:
    """The endless stream of `(x, {target: y})` batches of `batch` examples (see the module); bad
    records are counted in `skipped` and left out (`skip_counter`), or stop it (None)."""
    files = tf.data.Dataset.from_tensor_slices(list(shards.paths))
    if shuffle:
        files = files.shuffle(len(shards.paths), seed=seed, reshuffle_each_iteration=True)
    records = files.repeat().interleave(_numbered, cycle_length=min(CYCLE, len(shards.paths)), block_length=1,
                                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    examples = _examples(records, shards, skipped)
    if shuffle:
        examples = examples.shuffle(shards.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    return examples.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def validation(shards: Shards, batch: int, skipped: tf.Variable | None = None) -> tf.data.Dataset | None:
    """The validation files' records once, in order, in batches of at most `batch`; None without any.
    Bad records as for `training` (counted on every evaluation that reads them)."""
    if not shards.val_paths:
        return None
    files = tf.data.Dataset.from_tensor_slices(list(shards.val_paths))
    examples = _examples(files.flat_map(_numbered), shards, skipped)
    return examples.batch(batch).prefetch(tf.data.AUTOTUNE)
