"""The `tf.data` stream of CSV files (`data=csv data.stream=true`, `csv_record.CsvFiles`):
rows read from their files while training, never gathered into NumPy.

Training: the file names, shuffled per epoch from `seed`; each file's lines (`TextLineDataset`,
its header skipped), numbered and cut into chunks, several files read at a time (`interleave`, in
parallel, in a deterministic order); each chunk parsed in one op; the chunks shuffled whole and
permuted in groups of `shuffle_buffer` rows (`chain.data.chunks.epochs`: no stage handles one row at a
time); all that repeated (every row exactly once an epoch), batches cut and read ahead. Every stage
is checkpointable: the iterator's
state goes into every checkpoint and a resumed run sees the batches it would have seen. Blank lines
are left out, as the loaded CSV source leaves them out.

A bad row found mid-run (a cell that is not a finite number, more or fewer cells than the header
has columns, a class label that is not a whole number in 0..C-1) stops the run with one line naming
the file and the line (`bad_record`), or, with `data.on_bad_record=skip`, is counted and left out.
Cells are plain numbers: a quoted cell is a bad row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import tensorflow as tf

from chain.data.chunks import PARALLEL, epochs, interleaved, shuffled
from chain.data.sources.csv.csv_record import CsvFiles

CHUNK = 256  # lines parsed in one op: a parse per line would make the stream the bottleneck

# Python's float() spellings of a finite number (no nan/inf: the loaded source refuses them too)
NUMBER = r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?"
MARK = "chain-bad-row"  # starts the assertion's data, so the host finds it in TensorFlow's message
END = "<end>"  # ends the assertion's reason, which may hold brackets itself
BAD = re.compile(MARK + r"\]\s*\[(.*?)\]\s*\[(\d+)\]\s*\[(.*?)" + END, re.S)


def _numbered(path) -> tf.data.Dataset:
    """The lines of the file `path` after its header, in chunks, each line with its file and its
    line number (1-based, the header being line 1)."""
    lines = tf.data.TextLineDataset(path).enumerate().skip(1).batch(CHUNK)
    return lines.map(lambda k, text: (tf.fill(tf.shape(k), path), k + 1, text))


def _labels_ok(files: CsvFiles, dense: tf.Tensor) -> list[tf.Tensor]:
    """Per row and target: a class target holds a whole number in 0..classes-1 (a value anything)."""
    return [
        tf.ones([tf.shape(dense)[0]], tf.bool)
        if not classes
        else tf.equal(dense[:, column], tf.round(dense[:, column]))
        & (dense[:, column] >= 0)
        & (dense[:, column] < classes)
        for _, column, classes in files.targets
    ]


def _regular(files: CsvFiles, lines: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The chunk's rows when every line is `width` finite numbers and every label in range (the
    rule), with True; else zeros and False. One match per line and a conversion of the cells:
    about half the CPU time of the cell by cell check (`_checked`), which only a chunk that is not
    regular pays."""
    width = len(files.columns)
    line = f" *{NUMBER} *(, *{NUMBER} *){{{width - 1}}}"  # a row of `width` plain numbers (spaces around)
    n = tf.shape(lines)[0]

    def converted():
        dense = tf.reshape(tf.strings.to_number(tf.strings.split(lines, ",").flat_values, tf.float64), [n, width])
        return dense, tf.reduce_all(tf.math.is_finite(dense)) & tf.reduce_all(tf.stack(_labels_ok(files, dense)))

    return tf.cond(
        tf.reduce_all(tf.strings.regex_full_match(lines, line)),
        converted,
        lambda: (tf.zeros([n, width], tf.float64), tf.constant(False)),
    )


@dataclass(frozen=True)
class _Cells:
    """A chunk's lines cut into cells and checked: the raw cells (`cells`, ragged), each cell's text a
    finite number (`good`), the cells per line (`lengths`), the rows as numbers (`dense`), whether each
    line has the header's width (`fits`), only finite numbers (`good_rows`) and labels in range
    (`labels`, per target)."""

    cells: tf.RaggedTensor
    good: tf.Tensor
    lengths: tf.Tensor
    dense: tf.Tensor
    fits: tf.Tensor
    good_rows: tf.Tensor
    labels: list[tf.Tensor]


def _cells(files: CsvFiles, lines: tf.Tensor) -> _Cells:
    width = len(files.columns)
    cells = tf.strings.split(lines, ",")
    lengths = cells.row_lengths()
    text = tf.strings.strip(cells.flat_values)
    number = tf.strings.regex_full_match(text, NUMBER)
    values = tf.strings.to_number(tf.where(number, text, "0"), tf.float64)
    good = number & tf.math.is_finite(values)
    good_rows = tf.reduce_all(tf.RaggedTensor.from_row_lengths(good, lengths), axis=1)
    dense = tf.RaggedTensor.from_row_lengths(values, lengths).to_tensor(shape=[None, width])
    fits = tf.equal(lengths, width)
    return _Cells(cells, good, lengths, dense, fits, good_rows, _labels_ok(files, dense))


def _why(files: CsvFiles, c: _Cells, first: tf.Tensor) -> tf.Tensor:
    """Why row `first` of the chunk is bad, in words: its number of fields, a cell that is not a
    finite number, or a label out of range."""
    width = len(files.columns)
    row_cells = tf.RaggedTensor.from_row_lengths(c.good, c.lengths)[first]
    cell = tf.argmin(tf.cast(row_cells, tf.int32))
    raw = tf.RaggedTensor.from_row_lengths(c.cells.flat_values, c.lengths)[first]
    q = lambda s: tf.strings.join(["'", s, "'"])  # noqa: E731 (Python's repr of a plain cell)
    not_number = tf.strings.join(
        [
            "column ",
            q(tf.gather(tf.constant(list(files.columns)), tf.minimum(cell, width - 1))),
            " holds ",
            q(tf.gather(raw, cell, batch_dims=0)),
            ", not a finite number",
        ]
    )
    fields = tf.strings.join(["it has ", tf.strings.as_string(c.lengths[first]), f" fields, the header has {width}"])
    target = tf.argmin(tf.cast(tf.stack(c.labels, 1)[first], tf.int32))
    label_why = [
        tf.strings.join(
            [
                f"column '{files.columns[column]}' holds ",
                tf.strings.as_string(c.dense[first, column], shortest=True),
                f", not a class label 0..{classes - 1} (data.classes.{name}={classes})",
            ]
        )
        for name, column, classes in files.targets
    ]
    return tf.where(
        tf.logical_not(c.fits[first]),
        fields,
        tf.where(tf.logical_not(c.good_rows[first]), not_number, tf.gather(label_why, target)),
    )


def _checked(files: CsvFiles, skip: tf.Variable | None, paths, numbers, lines) -> tf.Tensor:
    """The chunk's good rows, each line's cells checked (a blank line left out, a bad row failing
    the stream or counted in `skip` and left out)."""
    present = tf.strings.length(tf.strings.strip(lines)) > 0
    c = _cells(files, lines)
    ok = c.fits & c.good_rows & tf.reduce_all(tf.stack(c.labels, 1), axis=1)
    bad = present & tf.logical_not(ok)

    def fail():
        first = tf.argmax(tf.cast(bad, tf.int32))
        why = _why(files, c, first)
        with tf.control_dependencies(
            [tf.debugging.Assert(False, [MARK, paths[first], numbers[first], tf.strings.join([why, END])])]
        ):
            return tf.constant(False)

    if skip is None:
        checks = [tf.cond(tf.reduce_any(bad), fail, lambda: tf.constant(True))]
    else:
        checks = [skip.assign_add(tf.reduce_sum(tf.cast(bad, tf.int64)))]
    with tf.control_dependencies(checks):
        return tf.boolean_mask(c.dense, present & ok)


def _parse_chunk(files: CsvFiles, skip: tf.Variable | None):
    """A chunk of (files, line numbers, lines) -> the chunk's good rows as (x, ys), parsed in one op.
    Unless `skip` (a counter of the rows left out), a chunk with a bad row fails naming the first."""

    def parse(paths, numbers, lines):
        lines = tf.strings.regex_replace(lines, "\r$", "")
        dense, clean = _regular(files, lines)
        rows = tf.cond(clean, lambda: dense, lambda: _checked(files, skip, paths, numbers, lines))
        x = tf.cast(tf.gather(rows, list(files.x), axis=1), tf.float32)
        ys = {
            name: tf.cast(rows[:, column], tf.int32 if classes else tf.float32)
            for name, column, classes in files.targets
        }
        return x, ys

    return parse


def _parsed(chunks: tf.data.Dataset, files: CsvFiles, skip: tf.Variable | None) -> tf.data.Dataset:
    """Chunks of (files, numbers, lines) -> chunks of their good rows (x float32, {target: int32
    label or float32 value})."""
    parsed = chunks.map(_parse_chunk(files, skip), num_parallel_calls=PARALLEL, deterministic=True)
    if skip is not None:
        # The counter is state outside the stream: a checkpoint saves the stream without it (so a
        # resumed run counts from 0 again), which tf.data refuses unless told.
        options = tf.data.Options()
        options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        parsed = parsed.with_options(options)
    return parsed


def bad_record(error: BaseException, files: CsvFiles) -> str | None:
    """The one line for a bad row that stopped the stream of `files` (naming the key whose glob
    matched its file and the line), or None when `error` is not one."""
    found = BAD.search(str(error))
    if not found:
        return None
    path, line, why = found.groups()
    why = why.replace("\\'", "'")  # TensorFlow's message escapes the quotes the reason puts around a cell
    return f"{files.key(path)}: line {line} of {path}: {why.strip()} (data.on_bad_record=skip leaves such rows out)"


def skip_counter(files: CsvFiles) -> tf.Variable | None:
    """The count of bad rows left out (`data.on_bad_record=skip`), or None when they stop the run."""
    return tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_records") if files.skip_bad else None


def training(
    files: CsvFiles, batch: int, shuffle: bool, seed: int, skipped: tf.Variable | None = None
) -> tf.data.Dataset:
    """The endless stream of `(x, {target: y})` batches of `batch` examples (see the module); bad
    rows are counted in `skipped` and left out, or stop it (None)."""
    names = shuffled(tf.data.Dataset.from_tensor_slices(list(files.paths)), len(files.paths), shuffle, seed)
    parsed = _parsed(interleaved(names, _numbered, len(files.paths)), files, skipped)
    return epochs(parsed, batch, files.shuffle_buffer, CHUNK, shuffle, seed)


def validation(files: CsvFiles, batch: int, skipped: tf.Variable | None = None) -> tf.data.Dataset | None:
    """The validation files' rows once, in order, in batches of at most `batch`; None without any."""
    if not files.val_paths:
        return None
    names = tf.data.Dataset.from_tensor_slices(list(files.val_paths))
    return _parsed(names.flat_map(_numbered), files, skipped).rebatch(batch).prefetch(tf.data.AUTOTUNE)
