"""The demo: what the examples use, and the library never imports (tests/test_package.py checks).

Model loading (:mod:`.models`, re-exported from :mod:`trl_otb.models`), math prompts (:mod:`.data`), math rewards
(:mod:`.rewards`), publishing on the Hugging Face Hub (:mod:`.hub`) and the demo's part of the model card
(:mod:`.card`).

Nothing is imported here: each module is imported on its own (``from trl_otb.demo.models import ...``), so that
loading a model imports neither math-verify (the rewards) nor datasets (the data).
"""
