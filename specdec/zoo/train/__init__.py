"""Train the zoo's checkpoints on the standard-library corpus: `specdec zoo train`.

Stages (each seeded, with a tqdm progress bar; AdamW, linear warm-up then cosine decay; random
windows of the train stream; bf16 autocast on CPU, fp32 master weights):

1. target   - a Llama-architecture byte-level LM, next-token cross-entropy.

Then a stage per draft kind the zoo ships (`specdec.draft_kinds`, `ZooStage`; each reads the stored target):

2. eagle    - an EAGLE head on the frozen target: smooth-L1 regression of its output hidden onto the
              target's next hidden state plus cross-entropy, through the shared LM head, against the
              target's distribution (distillation, so the head learns the target's argmax). Trained
              with "training-time test" unrolling: pass j feeds the head its own output hidden of pass
              j-1 (as draft step j does at inference) and attends to exactly the keys that draft step j
              sees (the real-hidden prefix, then one key per earlier draft step), see `ttt_mask`.
3. eagle3   - an EAGLE-3 head as the paper trains it: features from three target layers (low, middle,
              high), its own LM head over the whole vocabulary, cross-entropy only, training-time-test
              passes weighted 0.8 ** j, with the EAGLE head's budget (steps, tokens, unrolled passes).
4. mtp      - S MTP layers, MiMo style (every layer reads the target's hidden states), distilled from
              the target's distribution S+1 positions ahead.
5. mtp_chain- the same in Step-3.5 style (layer k reads layer k-1's output), trained jointly.
6. draft_lm - a standalone draft LM (SGLang's STANDALONE): a 1-layer Llama of the byte vocabulary sharing no
              weight with the target, distilled from the target's distribution; its step cost against the
              target's is measured after training.
7. dflash   - a DFlash block drafter (z-lab's): a few decoder layers over the target's features from several
              layers and a block of mask tokens after a random anchor, every block position distilled from the
              target's distribution, weighted decaying by position; its block forward's cost is measured after.

The target is stored in float16, the drafts' matrices in int8 with per-row scales (`save_stored`); the
loader dequantizes to fp32. Held-out metrics in the card are measured on the stored weights, in fp32,
without autocast, as inference runs.

The package's modules, each importing only those above it:

- `hparams`  the target's shape (`TargetShape`), each stage's settings (`StageOpts`, `default_opts`: the
             drafts' from their kinds), the stage names, the seeded windows of the train stream (`Windows`).
- `loop`     the optimisation loop every stage shares, the learning-rate schedule, the initialisation.
- `regenerate` the target's own greedy continuations of corpus prefixes (`regenerate_segments`) and the rows of
             them a head trains on with `--regen-data` (`SegmentWindows`).
- `stages`   each stage's loss and `train_<stage>` (the EAGLE heads' unrolled passes run their `step`).
- `evaluate` the held-out metrics of stored weights (the draft LM's along the target's greedy path).
- `storage`  what ships: `save_stored` (the drafts' int8 matrices by `models.io.quantize_int8_matrices`).
- `card`     card.json and its Markdown rendering (`render_model_cards` writes MODEL_CARD.md).
- `pipeline` `train_all`: the stages in order, stored, evaluated, the card written.
- `cli`      `main`, the argparse front end (`specdec zoo train`, `python -m specdec.zoo.train`).

Everything is importable from `specdec.zoo.train` itself.
"""
from __future__ import annotations

from .card import (MODEL_CARD, card_path, read_card, render_model_card, render_model_cards, shape_summary,
                   why_this_shape, write_card)
from .cli import main
from .evaluate import (evaluate_bundle, evaluate_dflash, evaluate_draft_lm, evaluate_dspark, evaluate_eagle,
                       evaluate_mtp, evaluate_target)
from .hparams import DRAFTS, EXTRA_STAGES, STAGES, StageOpts, TargetShape, Windows, default_opts
from .loop import init_weights_, lr_at, make_optimizer, num_params
from .pipeline import train_all
from .regenerate import SegmentWindows, load_segments, regenerate_segments
from .block_stages import DSPARK_LOSS_WEIGHTS, dflash_blocks, dflash_loss, dspark_loss, train_dflash, train_dspark
from .stages import (DRAFT_LM_SHAPE, draft_lm_loss, draft_vocabulary, eagle3_loss, eagle_loss, eagle_unrolled,
                     mtp_forward, mtp_loss, new_draft_lm, new_eagle3_head, pass_weights, soft_ce, target_loss,
                     train_draft_lm, train_eagle, train_eagle3, train_mtp, train_mtp_chain, train_target, ttt_mask,
                     zoo_feature_layers)
from .storage import DRAFT_STORAGE, STORE_DTYPE, save_stored

__all__ = ["DRAFTS", "DRAFT_LM_SHAPE", "DRAFT_STORAGE", "DSPARK_LOSS_WEIGHTS", "EXTRA_STAGES", "MODEL_CARD", "STAGES",
           "STORE_DTYPE", "SegmentWindows", "StageOpts", "TargetShape", "Windows", "card_path", "default_opts",
           "dflash_blocks", "dflash_loss", "draft_lm_loss", "draft_vocabulary", "dspark_loss", "eagle3_loss",
           "eagle_loss", "eagle_unrolled", "evaluate_bundle", "evaluate_dflash", "evaluate_draft_lm",
           "evaluate_dspark", "evaluate_eagle", "evaluate_mtp", "evaluate_target", "init_weights_", "load_segments",
           "lr_at", "main", "make_optimizer", "mtp_forward", "mtp_loss", "new_draft_lm", "new_eagle3_head",
           "num_params", "pass_weights", "read_card", "regenerate_segments", "render_model_card", "render_model_cards",
           "save_stored", "shape_summary", "soft_ce", "target_loss", "train_all", "train_dflash", "train_draft_lm",
           "train_dspark", "train_eagle", "train_eagle3", "train_mtp", "train_mtp_chain", "train_target", "ttt_mask",
           "why_this_shape", "write_card", "zoo_feature_layers"]
