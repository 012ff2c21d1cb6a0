"""Studies: many runs (cells) in one root, and the comparison a paper reports.

A study root holds ``study.json`` (its cells, their axis values, run roots and fingerprints:
docs/formats/study.md) and one ordinary run root per cell under ``cells/<name>/``;
``hallulog compare`` reads the cells' evaluations into one detector x cell table, paired
bootstraps between cells sharing prompts and transfer matrices of the probes (docs/studies.md).
Imports only contracts, storage and evaluation.
"""

from hallulog.study.cells import CellRef, cell_state, root_cells, study_cells
from hallulog.study.compare import CompareResult, compare
from hallulog.study.manifest import STUDY_VERSION, Cell, Study, load_study, make_cell, write_study
from hallulog.study.naming import AXES, StudyError, axis_label, cell_name, check_labels

__all__ = [
    "AXES",
    "STUDY_VERSION",
    "Cell",
    "CellRef",
    "CompareResult",
    "Study",
    "StudyError",
    "axis_label",
    "cell_name",
    "cell_state",
    "check_labels",
    "compare",
    "load_study",
    "make_cell",
    "root_cells",
    "study_cells",
    "write_study",
]
