"""The `tf.data` stream of TFRecord files (`data=tfrecord data.stream=true`, `tfrecord_record.Shards`):
records read from their files while training, never gathered into NumPy.

Training: the file names, shuffled per epoch from `seed`; their records read several files at a
time (`interleave`, in parallel, in a deterministic order) in chunks, each chunk parsed in one op;
the chunks shuffled whole and permuted in groups of `shuffle_buffer` examples, batches cut from
them (`rebatch`) and prefetched (`chain.data.chunks.epochs`). No stage handles one example at a time. Host memory
holds the buffers, not the data set. Every stage is checkpointable, so the iterator's state (file
positions, the shuffle buffer's chunks, the group being cut, the batches read ahead) goes into
every checkpoint as the in-memory stream's does, and a resumed run sees the batches it would have
seen.

Bad records found mid-run (a missing feature, a feature with more or fewer values than declared)
stop the run with one line naming the file and the record's number in it (`bad_record`, raised by
`chain.training.run.Run.fit`), or, with `data.on_bad_record=skip`, are left out. For `model=gpt`
(`Shards.ids`) each chunk's token ids are checked against its vocabulary as they are read (a few
reductions per chunk): one outside it stops the run with one line naming the record, never a
TensorFlow error from the embedding's lookup.
"""

from __future__ import annotations

import functools
import math
import re

import tensorflow as tf

from chain.data.sources.tfrecord import tfrecord_files
from chain.data.catalog import label_shape
from chain.data.chunks import PARALLEL, chunk_rows, epochs, interleaved, shuffled
from chain.data.sources.tfrecord.tfrecord_record import IdRange, Shards
from chain.errors import first_line


def _chunk(shards: Shards) -> int:
    """Records parsed in one op (`chain.data.chunks.chunk_rows` of the inputs' float32 values)."""
    return chunk_rows(4 * math.prod(dict(shards.features)[shards.x][1]))


MARK = "chain-bad-record"  # starts the assertion's data, so the host finds it in TensorFlow's message
END = "<end>"  # ends the assertion's reason, which may hold brackets itself
_BAD = re.compile(MARK + r"\]\s*\[(.*?)\]\s*\[(\d+)\]\s*\[(.*?)" + END, re.S)
_CORRUPTED = re.compile(r"corrupted record at (\d+)")  # TensorFlow's reader: a checksum failed at that byte
_MISMATCH = re.compile(r"Key: [^\n]*?Data types don't match\.[^\n\[]*[^\s\[]")
ID_MARK = "chain-bad-id"  # starts the data of the assertion that an id is outside the vocabulary
_BAD_ID = re.compile(ID_MARK + r"\]\s*\[(.*?)\]\s*\[(-?\d+)\]\s*\[(.*?)\]\s*\[(-?\d+)\]", re.S)


def _numbered(chunk: int):
    """path -> the records of that file in chunks of `chunk`, each chunk with its file and the
    number of its first record in the file (for error lines). A chunk comes from one file, so a
    scalar of each says it: a file name and a number per record (`tf.fill`) cost about a quarter of
    the reading's CPU time on small examples (measured alone), for an error line about one record.
    Zipped, not mapped: with a map's function call per chunk (`enumerate().map`) the reading took
    0.21 ms of CPU per 64 records of 64 floats, zipped 0.15 (measured alone)."""

    def records(path) -> tf.data.Dataset:
        return tf.data.Dataset.zip(
            (
                tf.data.Dataset.from_tensors(path).repeat(),
                tf.data.Dataset.range(0, 2**62, chunk),
                tf.data.TFRecordDataset(path).batch(chunk),
            )
        )

    return records


def _declared(feature: tuple) -> str:
    dtype, shape = feature
    return dtype + (f"[{','.join(map(str, shape))}]" if shape else "")


def _as_declared(ex: dict, want: dict[str, int], n) -> tf.Tensor:
    """True when a chunk of `n` parsed records is good (the rule): every feature holds n x its declared
    count of values and no value sits at a position past that count in its record, so every record
    holds exactly as many. Two small ops a feature; a count per record (`_counts`, a bincount) only
    for a chunk that is not good (the per-record check on every chunk cost the stream a fifth of its
    parse)."""
    return tf.reduce_all(
        tf.stack(
            [
                tf.logical_and(
                    tf.equal(tf.size(ex[name].values), n * want[name]),
                    tf.reduce_all(ex[name].indices[:, 1] < want[name]),
                )
                for name in want
            ]
        )
    )


def _counts(ex: dict, want: dict[str, int], n) -> dict[str, tf.Tensor]:
    """Each feature's number of values in each record."""
    return {
        name: tf.math.bincount(tf.cast(ex[name].indices[:, 0], tf.int32), minlength=n, maxlength=n) for name in want
    }


def _each_ok(counted: dict[str, tf.Tensor], want: dict[str, int]) -> tf.Tensor:
    """Per record: every feature holds as many values as declared."""
    return tf.reduce_all(tf.stack([tf.equal(counted[name], want[name]) for name in want]), axis=0)


def _fail(ex: dict, shards: Shards, want: dict[str, int], n, path, start) -> tf.Tensor:
    """An assertion that fails naming the chunk's first bad record and why (each feature whose number
    of values is not the declared one): worked out only for a bad chunk, since formatting it for every
    record would cost the stream."""
    features = dict(shards.features)
    counted = _counts(ex, want, n)
    first = tf.argmin(tf.cast(_each_ok(counted, want), tf.int32))
    why = tf.strings.join(
        [
            tf.where(
                tf.equal(counted[name][first], want[name]),
                "",
                tf.strings.join(
                    [
                        f"feature {name} holds ",
                        tf.strings.as_string(counted[name][first]),
                        f" values, declared {_declared(features[name])}; ",
                    ]
                ),
            )
            for name in want
        ]
        + [END]
    )
    with tf.control_dependencies([tf.debugging.Assert(False, [MARK, path, start + first, why])]):
        return tf.constant(False)


def _dense(ex: dict, name: str, shape: tuple, n, all_ok, ok, skip: bool) -> tf.Tensor:
    """Feature `name` of a chunk as a dense [n, *shape] tensor. A chunk of good records (the rule): the
    sparse values are already the dense ones in row-major order, so a reshape is all it takes.
    Otherwise (`skip`) a bad record's values are left out (it becomes zeros, then is masked out):
    sparse ops, 3x the parse's cost."""
    want = math.prod(shape)

    def bad():
        sp = tf.sparse.retain(ex[name], tf.gather(ok, ex[name].indices[:, 0]))
        sp = tf.SparseTensor(sp.indices, sp.values, tf.stack([tf.cast(n, tf.int64), want]))
        return tf.sparse.to_dense(sp)

    values = tf.cond(all_ok, lambda: ex[name].values, bad) if skip else ex[name].values
    return tf.reshape(values, [n, *shape])


def _parse_chunk(shards: Shards, skip: bool):
    """A chunk of (file, first number, serialized `tf.train.Example`s) -> (x, ys), with `skip` (x, ys, ok)
    per record, parsed in one op: every declared feature read with whatever number of values it
    holds, `ok` where each holds as many as declared. Unless `skip`, a chunk with a bad record fails,
    naming the first one (`_fail`)."""
    features = dict(shards.features)
    spec = {
        name: tf.io.VarLenFeature(tf.float32 if dtype == "float32" else tf.int64)
        for name, (dtype, _) in features.items()
    }
    want = {name: math.prod(shape) for name, (_, shape) in features.items()}

    def parse(path, start, records):
        n = tf.shape(records)[0]
        ex = tf.io.parse_example(records, spec)
        all_ok = _as_declared(ex, want, n)
        every = tf.fill([n], True)
        ok = tf.cond(all_ok, lambda: every, lambda: _each_ok(_counts(ex, want, n), want)) if skip else every
        checked = (
            []
            if skip
            else [tf.cond(all_ok, lambda: tf.constant(True), lambda: _fail(ex, shards, want, n, path, start))]
        )
        with tf.control_dependencies(checked):
            dense = functools.partial(_dense, ex, n=n, all_ok=all_ok, ok=ok, skip=skip)
            x = dense(shards.x, features[shards.x][1])  # float32, or int64 (token ids: float32 is exact below 2^24)
            ys = {
                name: tf.cast(  # a label per position kept
                    tf.reshape(dense(key, features[key][1]), [n, *label_shape(features[key][1])]),
                    tf.int32 if classes else tf.float32,
                )
                for name, key, classes in shards.targets
            }
        if shards.ids is not None:  # model=gpt: its ids within the vocabulary
            label = dense(shards.ids.target, features[shards.ids.target][1])
            with tf.control_dependencies(ids_checked(shards.ids, shards.x, x, label, path, start)):
                x = tf.identity(x)
        return (x, ys, ok) if skip else (x, ys)

    return parse


def ids_checked(ids: IdRange, x_name: str, x: tf.Tensor, label: tf.Tensor, path, start) -> list[tf.Tensor]:
    """Assertions that the ids of `x` (the input, [n, ...]) and `label` (feature `ids.target`'s values,
    [n, ...]; `ids.ignored` allowed too) are within `[0, ids.vocab)`, each failing with the first record of
    the chunk (its file `path`, number `start` onwards; "" and -1: not known) that holds another, and
    that id. The record and the id are worked out only for a chunk that fails."""
    checks = []
    for name, values, ignored in ((x_name, x, None), (ids.target, label, ids.ignored)):
        inside = tf.logical_and(values >= 0, values < ids.vocab)
        if ignored is not None:
            inside = tf.logical_or(inside, tf.equal(values, ignored))

        def fail(values=values, inside=inside, name=name):
            n = tf.shape(values)[0]
            rows, ok = tf.reshape(values, [n, -1]), tf.reshape(inside, [n, -1])
            first = tf.argmin(tf.cast(tf.reduce_all(ok, axis=1), tf.int32), output_type=tf.int64)
            bad = tf.boolean_mask(rows[first], tf.logical_not(ok[first]))[0]
            with tf.control_dependencies([tf.debugging.Assert(False, [ID_MARK, path, start + first, name, bad])]):
                return tf.constant(False)

        checks.append(tf.cond(tf.reduce_all(inside), lambda: tf.constant(True), fail))
    return checks


def _parsed(chunks: tf.data.Dataset, shards: Shards, skip: tf.Variable | None) -> tf.data.Dataset:
    """Chunks of (file, first number, records) -> parsed chunks (x float32 [n, ...], {target: int32
    label or float32 value [n]}); a bad record fails the stream naming its file and number, unless
    `skip` (a counter): then each chunk also holds ok [n], for `_kept`."""
    return chunks.map(_parse_chunk(shards, skip is not None), num_parallel_calls=PARALLEL, deterministic=True)


def _kept(chunks: tf.data.Dataset, skip: tf.Variable | None) -> tf.data.Dataset:
    """Parsed chunks -> chunks (x, ys) of their good records: with `skip` (a counter) the chunks
    hold (x, ys, ok) and the bad ones are counted and left out, a whole chunk at a time (one mask
    per chunk, not an op per example); without, they are already (x, ys)."""
    if skip is None:  # parsed as (x, ys): every record is good or the stream stopped
        return chunks

    def keep(x, ys, ok):
        with tf.control_dependencies([skip.assign_add(tf.reduce_sum(tf.cast(tf.logical_not(ok), tf.int64)))]):
            return tf.boolean_mask(x, ok), {k: tf.boolean_mask(v, ok) for k, v in ys.items()}

    # The counter is state outside the stream: a checkpoint saves the stream without it (so a
    # resumed run counts from 0 again), which tf.data refuses unless told.
    options = tf.data.Options()
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return chunks.map(keep).with_options(options)


def bad_record(error: BaseException, shards: Shards) -> str | None:
    """The one line for a bad record that stopped the stream of `shards` (naming the key whose glob
    matched its file), or None when `error` is not one."""
    key = "data.path" if shards.val_key == "data.path" else "data.path or data.val_path"
    text = str(error)
    outside = _BAD_ID.search(text) if shards.ids is not None else None
    if outside:
        path, i, name, value = outside.groups()
        where = f"record {i} of {path}" if path else f"a record of {key}"
        vocab = shards.ids.vocab
        return (
            f"feature {name} of {where} holds the id {value}; model.vocab={vocab} takes ids 0..{vocab - 1}: give "
            "model.vocab (and data.classes) the largest id + 1 or more"
        )
    found = _BAD.search(text)
    if not found and (isinstance(error, tf.errors.DataLossError) or "Data types don't match" in text):
        corrupted = _CORRUPTED.search(text)
        if corrupted:  # TensorFlow names the byte offset only: the file is the one whose checksum fails there
            at = int(corrupted.group(1))
            for path in (*shards.paths, *shards.val_paths):
                record = tfrecord_files.damaged(path, at)
                if record is not None:
                    return (
                        f"{shards.key(path)}: record {record} of {path} is damaged: its checksum fails "
                        f"(TensorFlow: corrupted record at byte {at}); write the file again, or leave it out "
                        "(data.on_bad_record=skip does not leave out a damaged record)"
                    )
        # The reason, wherever it sits: a compiled loop's error starts "Graph execution error:", an eager
        # one with tf.data's "Error in user-defined ..."
        reason = corrupted or _MISMATCH.search(text)
        said = re.sub(r"\s+", " ", reason.group(0)).strip() if reason else first_line(error, typed=False)
        return (
            f"{key}: a record cannot be read ({said}): a damaged record, or a feature whose type is not the one "
            "data.features declares; TensorFlow does not say in which file"
        )
    if not found:
        return None
    path, i, why = found.groups()
    return (
        f"{shards.key(path)}: record {i} of {path} is not as data.features declares it: {why.strip().rstrip(';')} "
        "(data.on_bad_record=skip leaves such records out)"
    )


def skip_counter(shards: Shards) -> tf.Variable | None:
    """The count of bad records left out (`data.on_bad_record=skip`), or None when they stop the run."""
    return tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_records") if shards.skip_bad else None


def training(
    shards: Shards,
    batch: int,
    shuffle: bool,
    seed: int,
    skipped: tf.Variable | None = None,
    share: tuple[int, int] | None = None,
) -> tf.data.Dataset:
    """The endless stream of `(x, {target: y})` batches of `batch` examples (see the module); bad
    records are counted in `skipped` and left out (`skip_counter`), or stop it (None).

    Every stage works on chunks of records, never on one example (`chain.data.chunks`): the batches are
    cut from the chunks by `rebatch`. Without `shuffle` the records come in the files' order,
    a chunk of each file in turn.

    `share=(r, R)`: only replica r's files of R replicas, `shards.paths[r::R]` (a fixed deal, see
    `replica_files`), as the stream of a data set of just those files would read them."""
    paths = replica_files(shards, *share) if share is not None else list(shards.paths)
    files = shuffled(tf.data.Dataset.from_tensor_slices(paths), len(paths), shuffle, seed)
    chunk = _chunk(shards)
    parsed = _parsed(interleaved(files.repeat(), _numbered(chunk), len(paths)), shards, skipped)
    return epochs(
        parsed,
        batch,
        shards.shuffle_buffer,
        chunk,
        shuffle,
        seed,
        endless=True,
        kept=functools.partial(_kept, skip=skipped),
    )


def replica_files(shards: Shards, replica: int, replicas: int) -> list[str]:
    """Replica `replica`'s training files of `replicas`: the files `replica`, `replica + replicas`, ...
    in sorted order, the same in every epoch. A fixed deal rather than one redrawn per epoch: a file
    is then read by one replica only, even when replicas whose files hold more records fall a pass
    behind the others, and a host opens only its own replicas' files while training."""
    if not 0 <= replica < replicas <= len(shards.paths):
        raise ValueError(f"replica {replica} of {replicas} over {len(shards.paths)} files")
    return list(shards.paths[replica::replicas])


def validation(shards: Shards, batch: int, skipped: tf.Variable | None = None) -> tf.data.Dataset | None:
    """The validation files' records once, in order, in batches of at most `batch`; None without any.
    Bad records as for `training` (counted on every evaluation that reads them)."""
    if not shards.val_paths:
        return None
    files = tf.data.Dataset.from_tensor_slices(list(shards.val_paths))
    chunks = _parsed(files.flat_map(_numbered(_chunk(shards))), shards, skipped)
    return _kept(chunks, skipped).rebatch(batch).prefetch(tf.data.AUTOTUNE)
