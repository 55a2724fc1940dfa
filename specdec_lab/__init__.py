"""specdec-lab: speculative decoding, built step by step and tested.

The notebooks in `notebooks/` derive every piece; this package holds the final versions.
"""

__version__ = "0.1.0"

# The one place the repository address lives. `python tools/nbtool.py stamp` writes it into
# the Colab badges and the setup cell of every notebook; a test checks they agree.
REPO_URL = "https://github.com/specdec-lab/specdec-lab"

# The speculative loop and the draft-model drafter (chapter 03), importable from the package root.
from specdec_lab.decoding import Generation, generate  # noqa: E402
from specdec_lab.drafters import DraftModelDrafter  # noqa: E402

# Drafting without a drafter (chapter 07): prompt lookup and lookahead decoding.
from specdec_lab.ngram import PromptLookupDrafter  # noqa: E402
from specdec_lab.lookahead import lookahead_generate  # noqa: E402

# Medusa (chapter 05): heads on the target's last hidden state, verified as a tree.
from specdec_lab.medusa import MedusaDrafter  # noqa: E402

# EAGLE (chapter 06): a one-layer draft over the target's features; EAGLE-2's dynamic tree; EAGLE-3.
from specdec_lab.eagle import EagleDrafter  # noqa: E402

# Serving (chapter 09): B requests decoded together, each row accepting its own drafts.
from specdec_lab.serving import generate_batch  # noqa: E402
