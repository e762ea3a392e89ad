"""What the two chain drafters (MultiLayerEagleWorkerV2's MTP layers, DFlashWorker's block) share: a chain's verify
tree, the same every step."""
from __future__ import annotations

import torch


def chain_verify_input(max_batch: int, W: int, device):
    """A chain's verify tree of W nodes, the same every step, built once for the largest batch (slice each
    to B): (tree_mask (max_batch, W, W) bool, retrieve_index, retrieve_next_token, retrieve_next_sibling)."""
    mask = torch.ones(W, W, dtype=torch.bool, device=device).tril().expand(max_batch, W, W)
    retrieve_index = torch.arange(max_batch * W, device=device).view(max_batch, W)
    next_token = torch.cat([torch.arange(1, W), torch.tensor([-1])]).to(device)
    next_sibling = torch.full((max_batch, W), -1, dtype=torch.int64, device=device)
    return mask, retrieve_index, next_token.expand(max_batch, W).contiguous(), next_sibling
