"""Input rows from .jsonl, .json (an array) or .parquet files, or a folder of them.

Rows are yielded as (where, payload): ``where`` is "file:line" (jsonl) or "file:row"; the payload
is the raw line for jsonl (parsed by the workers) or the parsed row otherwise.
"""

from __future__ import annotations

import json
import os
from typing import Iterator, List, Tuple

EXTENSIONS = (".jsonl", ".json", ".parquet")


class InputError(ValueError):
    """The input path or a whole file cannot be read."""


class BadEncoding:
    """Payload of a row that is not valid UTF-8 (counted as ``bad_encoding``, never decoded with U+FFFD)."""


def input_files(path: str) -> List[str]:
    named = path if os.path.isabs(path) else f"{path} ({os.path.abspath(path)})"  # where a relative one was read
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(EXTENSIONS))
        if not files:
            raise InputError(f"input {named}: folder holds no {', '.join(EXTENSIONS)} files")
        return files
    if not os.path.isfile(path):
        raise InputError(f"input {named}: no such file or folder")
    if not path.endswith(EXTENSIONS):
        raise InputError(f"input {named}: expected a {', '.join(EXTENSIONS)} file")
    return [path]


def iter_rows(path: str) -> Iterator[Tuple[str, object]]:
    for file in input_files(path):
        name = os.path.basename(file)
        if file.endswith(".jsonl"):
            with open(file, "rb") as fh:
                for number, raw in enumerate(fh, 1):
                    try:  # a byte-order mark (Windows editors) opens the file: not part of the first row
                        line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
                    except UnicodeDecodeError:
                        yield f"{name}:{number}", BadEncoding()
                        continue
                    if line.strip():
                        yield f"{name}:{number}", line
        elif file.endswith(".json"):
            try:
                with open(file, encoding="utf-8-sig") as fh:
                    data = json.load(fh)
            except json.JSONDecodeError as exc:
                raise InputError(f"input {file}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
            except UnicodeDecodeError as exc:
                raise InputError(f"input {file}: not UTF-8 text (byte {exc.start})") from None
            if not isinstance(data, list):
                raise InputError(f"input {file}: a .json input must hold an array of rows")
            for number, row in enumerate(data, 1):
                yield f"{name}:{number}", row
        else:
            import pyarrow.parquet as pq

            try:
                table = pq.ParquetFile(file)
            except Exception as exc:  # noqa: BLE001 - any reader failure is a bad file
                raise InputError(f"input {file}: not a readable parquet file ({exc})") from None
            number = 0
            for batch in table.iter_batches(batch_size=4096):
                for row in batch.to_pylist():
                    number += 1
                    yield f"{name}:{number}", row
