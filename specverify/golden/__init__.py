"""`python -m specverify golden`: the golden files of `golden/`, made by the reference and held
against both decoders.

Commands (`--root DIR` reads / writes another golden directory; `--catalogue MODULE:ATTR` names
the catalogue, default `tests.support.golden_catalogue:CATALOGUE`):

    python -m specverify golden regen [--filter PAT ...] [--prune] [--force] [--platform NAME]
    python -m specverify golden check [--filter PAT ...] [--side both|reference|optimized] [--platform NAME]
    python -m specverify golden list  [--filter PAT ...]

A `--filter` pattern selects the goldens whose name contains it (or matches it, when it holds a
glob character `*?[`). Exit status: 0 all good, 1 a mismatch / missing / corrupt / stale or unused
golden, 2 bad arguments (an unknown profile, a filter that matches nothing, a catalogue that cannot
be loaded).

On-disk format (FORMAT_VERSION 1). One golden `NAME` is two files, `NAME.json` and `NAME.npz`:

- `NAME.npz` is a plain uncompressed zip of `.npy` members written by `_zip_stored` (fixed
  timestamps, members in traversal order), so the bytes depend only on the values;
- `NAME.json` (sorted keys, floats in their exact shortest repr, a trailing newline) holds the
  format tag and version, the name, `made_with` (torch / triton / numpy / python versions, the
  platform profile and its device; no time stamp, no host name), `meta` (the catalogue's fields —
  generator, seed, dtype — plus the comparison `rules` per output and the `tolerance` applied:
  dtype, atol, rtol), the `inputs` and reference `outputs` trees, and the sha256 of the npz;
- a tree is JSON where JSON is exact (None, bool, int, str, finite float, list) and a one-key
  object otherwise: `{"$tensor": {dtype, shape, array}}` (the bits, as uint8 / int16 / int32 /
  int64 for the dtypes numpy lacks: bfloat16 and the four FP8 formats), `{"$ndarray": ...}`,
  `{"$npscalar": ...}`, `{"$tuple": [...]}`, `{"$dict": {...}, "order": [keys]}` (str keys; the insertion
  order, written when it is not the sorted one), `{"$pairs": [[key, value], ...]}` (other keys),
  `{"$float": "nan", "bits": HEX}` / `"inf"` / `"-inf"`, `{"$bytes": HEX}`; `array` names an
  npz member.

Comparison: every output leaf by its rule: `exact` (integers equal; floats bit-equal, any NaN
matching any NaN) or `close` (`specverify.dtypes.TOLERANCES[tolerance dtype stored in the
golden]`, integers still exact). A shape or dtype-kind mismatch, and an output present on one side
only, are failures. A failure names, per leaf, how many values differ of how many, the largest
absolute and relative error and the first mismatches, and writes `NAME.<side>.obtained.json/.npz`
beside the golden (side: `reference` or `optimized-<profile>`; git-ignored, never read back).

Accept-length baselines: `accept_lengths/<profile>.json`, the mean accept length per cycle the
optimized decoder measured on that profile per scenario; checked one-sided with the relative
tolerance the file states (catalogue default 0.05): measured < baseline * (1 - tol) fails, measured
> baseline * (1 + tol) is reported. `regen` writes only the running profile's file (`--platform`
or SPECVERIFY_PLATFORM chooses it); `check` reports a profile without a baseline file with the
command that records it, without failing.

Regeneration writes a golden only when its bytes change; one whose content is unchanged but was
made with other library versions is left alone (and said so) unless `--force`. Tests never write
goldens; they only read them (and may write `.obtained` files).
"""

# The package's modules, one job each; each imports only those before it in this order:
# errors, trees, files, comparison, catalogue, baselines, sides, selection, regenerate, checking, cli.
from specverify.golden.errors import (CLOSE, EXACT, GOLDEN_DIR, OBTAINED, OPTIMIZED, REFERENCE, ROOT, RULES,
                                      GoldenCorrupt, GoldenError, GoldenFieldMissing, GoldenMissing,
                                      GoldenVersionUnknown, InputDrift, check_name, golden_paths, obtained_paths,
                                      regen_command)
from specverify.golden.trees import decode, encode
from specverify.golden.files import (FORMAT, FORMAT_VERSION, VERSION_KEYS, Golden, dump_json, environment,
                                     load_golden, render, tolerance_entry, version_notes)
from specverify.golden.comparison import FIRST_MISMATCHES, Comparison, LeafDiff, compare, compare_arrays
from specverify.golden.catalogue import (DEFAULT_CATALOGUE, AcceptScenario, BaselineSet, GoldenCase,
                                         load_catalogue)
from specverify.golden.baselines import (ACCEPT_RULE, BaselineResult, baseline_command, check_accept,
                                         judge_accept, load_baselines, render_baselines)
from specverify.golden.sides import SideResult, run_side, side_name, stale_reasons
from specverify.golden.selection import files_on_disk, find_missing, find_unused, matches, remove_golden
from specverify.golden.regenerate import RegenReport, regen
from specverify.golden.checking import check
from specverify.golden.cli import add_arguments, command, main
