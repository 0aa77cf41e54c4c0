"""Train a small MLP with the activations autograd saves kept compressed (REL 1e-2) until
backward needs them."""
import torch

import kompress.torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(512, 256), torch.randint(0, 10, (512,))

for step in range(3):
    optimizer.zero_grad()
    with kompress.torch.compressed_activations(rel=1e-2, budget_bytes=16 << 20, min_numel=4096) as hooks:
        logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, y)  # outside: its saved log-probabilities stay exact
    loss.backward()                      # each activation restored within the bound
    optimizer.step()
print(f"loss {loss.item():.4f}; saved activations peaked at {hooks.peak_bytes} bytes compressed")
