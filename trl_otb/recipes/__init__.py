"""What the examples use: the embedded default model and model loading (:mod:`.models`), math prompts
(:mod:`.data`), math rewards (:mod:`.rewards`) and publishing on the Hugging Face Hub (:mod:`.hub`).

Nothing is imported here: each module is imported on its own (``from trl_otb.recipes.models import ...``), so that
loading a model imports neither math-verify (the rewards) nor datasets (the data).
"""
