"""Writes model.safetensors into the folder given: all-MiniLM-L6-v2's shapes and names (its config.json),
random weights (BertModel's own initialisation, seed 0). For timing only: no accuracy is read from it."""
import sys

import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertModel

torch.manual_seed(0)
model = BertModel(BertConfig.from_pretrained(sys.argv[1]))
save_file({k: v.contiguous() for k, v in model.state_dict().items()}, sys.argv[1] + "/model.safetensors",
          metadata={"format": "pt"})
print("random MiniLM:", sum(v.numel() for v in model.state_dict().values()), "values")
