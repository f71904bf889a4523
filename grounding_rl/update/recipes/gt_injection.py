"""TempSamp-R1's ground-truth-guided groups (arXiv 2509.18056; ZhangZikun6666/TempSamp-R1
``algorithm.use_gt_injection``, ``gt_replace_index: -1``): the last completion of every group is replaced by the
ground-truth answer (:func:`grounding_rl.prompts.templates.answer_text` in the run's template, then EOS) and scored like
the others. The rollout marks those rows (:attr:`Rollout.is_gt`): their sampling log-probs are NaN and the logged
rollout metrics leave them out (TempSamp-R1's ``gt_log_exclude``)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grounding_rl.update.grpo import injected_rows
from grounding_rl.update.recipes.base import Recipe


@dataclass
class GroundTruthInjectionArguments:
    use_gt_injection: bool = field(
        default=False,
        metadata={
            "help": "TempSamp-R1's ground-truth-guided groups (arXiv 2509.18056; ZhangZikun6666/TempSamp-R1 "
            "`algorithm.use_gt_injection`, `gt_replace_index` -1): the last completion of every group is replaced by "
            "the ground-truth interval written in the template's answer format (with a think block where the "
            "template asks for one) and scored like the others; it joins its group's mean and std. Its log-probs "
            "are computed by the policy (π_old = the policy at generation time), never sampled. Logged reward "
            "means cover the sampled completions only (TempSamp-R1's `gt_log_exclude`)."
        },
    )


class GroundTruthInjection(Recipe):
    name = "gt_injection"
    arguments = GroundTruthInjectionArguments
    refused = {"distill": {"use_gt_injection": "the student samples every completion"}}
    switch = "use_gt_injection"

    def inject(self, context, items, completion_ids, start):
        """``(ids, rows)``: ``completion_ids`` (B, C) with the last row of each group (global rows from ``start``)
        replaced by the ground truth, widened to C' ≥ C if needed; rows (B,) bool.

        Raises:
            UserError: a ground-truth answer does not fit in ``max_completion_length`` tokens.
        """
        from grounding_rl.errors import UserError
        from grounding_rl.prompts.templates import answer_set_text, answer_text

        rows = injected_rows(start, len(items), context.num_generations, completion_ids.device)
        picked = rows.nonzero().flatten().tolist()
        if not picked:
            return completion_ids, rows
        tokenizer, limit = context.processing_class.tokenizer, self.config.max_completion_length
        answers = []
        for r in picked:
            item = items[r]
            text = (answer_set_text(item["spans"], template=self.config.prompt_template) if item.get("spans") else
                    answer_text(item["start"], item["end"], template=self.config.prompt_template))
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [context.eos_token_ids[0]]
            if len(ids) > limit:
                raise UserError(f"use_gt_injection: the ground-truth answer of sample {item['index']} (qid "
                                f"{item['qid']}) is {len(ids)} tokens with EOS, more than max_completion_length "
                                f"{limit}; raise max_completion_length")
            answers.append(ids)
        width = max(completion_ids.size(1), max(len(ids) for ids in answers))
        pad = context.pad_token_id
        out = completion_ids.new_full((completion_ids.size(0), width), pad)
        out[:, :completion_ids.size(1)] = completion_ids
        for r, ids in zip(picked, answers):
            out[r] = pad
            out[r, :len(ids)] = torch.tensor(ids, dtype=out.dtype, device=out.device)
        return out, rows
