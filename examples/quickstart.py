"""Train the embedded SmolLM2-135M-Instruct with OTB for a few steps on CPU (about a minute).

python examples/quickstart.py
"""

from trl_otb import OTBConfig, OTBTrainer
from trl_otb.demo.data import load_math_dataset
from trl_otb.demo.models import embedded_model_path
from trl_otb.demo.rewards import accuracy_reward, format_reward

model = embedded_model_path()  # converts the packaged GGUF once, then loads in under a second
dataset = load_math_dataset(split="train", num_train=64)

args = OTBConfig(
    output_dir="outputs/quickstart",
    num_generations=4,  # OTB's group size: the paper's N=4
    per_device_train_batch_size=4,
    max_completion_length=32,
    max_steps=4,
    learning_rate=1e-5,
    logging_steps=1,
    use_cpu=True,
    bf16=False,
    gradient_checkpointing=False,  # CPU settings
    report_to="none",
    save_strategy="no",
)
trainer = OTBTrainer(model, reward_funcs=[accuracy_reward, format_reward], args=args, train_dataset=dataset)
trainer.train()

print("\nstep  reward  adv_std  baseline!=mean  proxy_mean  W_last_mean")
for log in (entry for entry in trainer.state.log_history if "otb/advantage_std" in entry):
    print(
        f"{log['step']:>4}  {log['reward']:6.3f}  {log['otb/advantage_std']:7.3f}  "
        f"{log['otb/baseline_differs_frac']:14.2f}  {log['otb/proxy_mean']:10.3f}  {log['otb/energy_last_mean']:11.2f}"
    )
