"""Batched greedy and beam search for an encoder-decoder, with a key/value cache.

The model protocol (e.g. `tasks.common.seq2seq.Seq2SeqTransformer`):

    memory = model.encode(src_ids, src_padding_mask)              # (B, S, D)
    cache = model.start_decoding(memory, src_padding_mask)        # cross-attention K/V once
    hidden = model.decode_step(token_ids, cache)                  # (B, D), the next position
    logits = model.project(hidden)                                # (B, V)
    cache.select(rows)                                            # beam search: keep these rows

A step feeds one token per hypothesis (the library's KV cache and layer steps,
`attnlab.attention.kv_cache`), so decoding costs one decoder pass per generated token instead of
one per prefix position, and the article is projected to cross-attention keys/values once
instead of at every step.

Both searches pick tokens with the same `_top_tokens`, so that beam search with one beam is
exactly greedy search (same ties, same ids), which the tests check.

Outputs are (B, L) id tensors without the start token, ending with `eos_id` where the search
produced it, padded with `pad_id` after it.

Decoder-only models (`tasks.lm.model.TransformerLM`) continue a prompt with `sample` (greedy or
top-k sampling); their protocol has no encoder:

    cache = model.start_decoding()                                # empty KV cache (or prefix store)
    hidden = model.decode_step(token_ids, cache)                  # (B, D), the next position
    logits = model.project(hidden)                                # (B, V)
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.errors import ConfigError


def _check_max_length(model, max_length: int) -> None:
    limit = getattr(model, "max_target_positions", None)
    if max_length < 1:
        raise ConfigError(f"decoding max_length={max_length} must be >= 1")
    if limit is not None and max_length + 1 > limit:
        raise ConfigError(
            f"decoding max_length={max_length} needs {max_length + 1} decoder positions (with the "
            f"start token) but the model has {limit}; lower the max length or raise "
            f"task.module.max_target_positions"
        )


def _next_log_probs(model, token: Tensor, cache) -> Tensor:
    """Log-probabilities (B, V) of the token after `token`, the newest of each prefix."""
    return torch.log_softmax(model.project(model.decode_step(token, cache)).float(), dim=-1)


def _top_tokens(log_probs: Tensor, k: int) -> tuple[Tensor, Tensor]:
    return torch.topk(log_probs, k, dim=-1)


@torch.no_grad()
def greedy_decode(
    model,
    src_ids: Tensor,
    src_padding_mask: Tensor | None,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_length: int,
) -> Tensor:
    _check_max_length(model, max_length)
    cache = model.start_decoding(model.encode(src_ids, src_padding_mask), src_padding_mask)
    batch = src_ids.shape[0]
    prefix = torch.full((batch, 1), bos_id, dtype=torch.long, device=src_ids.device)
    finished = torch.zeros(batch, dtype=torch.bool, device=src_ids.device)
    for _ in range(max_length):
        log_probs = _next_log_probs(model, prefix[:, -1], cache)
        token = _top_tokens(log_probs, 1)[1].squeeze(-1)
        token = token.masked_fill(finished, pad_id)
        prefix = torch.cat([prefix, token[:, None]], dim=1)
        finished |= token == eos_id
        if bool(finished.all()):
            break
    return prefix[:, 1:]


def length_penalty_factor(lengths: Tensor, alpha: float) -> Tensor:
    """GNMT length penalty ((5 + |y|) / 6) ** alpha (Wu et al. 2016); alpha = 0 turns it off."""
    return ((5.0 + lengths.float()) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
    model,
    src_ids: Tensor,
    src_padding_mask: Tensor | None,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_length: int,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    stop_early: bool = True,
) -> Tensor:
    """Beam search with a fixed number of hypotheses per example.

    A hypothesis that emits EOS stays in its beam with its score frozen (it can only be extended
    by padding, at log-probability 0), so it keeps competing by raw log-probability with the
    running ones. At the end the hypothesis with the best length-normalized score wins.

    `stop_early` ends the search once, in every example, no running hypothesis can still beat the
    best finished one: log-probabilities only fall, so a running score s can at best become
    s / lp at the length (up to max_length) where the length penalty lp is largest. The result
    is the one of searching on to max_length (tested), without the steps an undertrained model
    spends on hypotheses that never emit EOS. (Only for length_penalty >= 0.)
    """
    if beam_size < 1:
        raise ConfigError(f"beam_size={beam_size} must be >= 1 (1 is greedy search)")
    _check_max_length(model, max_length)
    device = src_ids.device
    batch, k = src_ids.shape[0], beam_size
    # The cache starts with one row per example; repeating it makes rows b*k .. b*k + k - 1 the
    # k hypotheses of example b (the article's keys/values are projected once, not k times).
    cache = model.start_decoding(model.encode(src_ids, src_padding_mask), src_padding_mask)
    cache.select(torch.arange(batch, device=device).repeat_interleave(k))

    prefix = torch.full((batch * k, 1), bos_id, dtype=torch.long, device=device)
    # Only the first hypothesis is alive at the start; the others would duplicate it.
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    scores = scores.view(-1)
    finished = torch.zeros(batch * k, dtype=torch.bool, device=device)
    lengths = torch.zeros(batch * k, dtype=torch.long, device=device)
    # a negative penalty favours short hypotheses: running ones could then still push the best
    # finished one out of the beam, and the bound below would not be exact
    early = stop_early and length_penalty >= 0
    # the penalty grows with the length: max_length's is the largest a running one can reach
    lp_longest = length_penalty_factor(torch.tensor(max_length), length_penalty).item()

    for _ in range(max_length):
        log_probs = _next_log_probs(model, prefix[:, -1], cache)
        # Finished hypotheses: the only continuation is padding, at no cost.
        pad_only = torch.full_like(log_probs, float("-inf"))
        pad_only[:, pad_id] = 0.0
        log_probs = torch.where(finished[:, None], pad_only, log_probs)
        # The best k continuations of every hypothesis contain the best k of the whole beam.
        n = min(k, log_probs.shape[-1])
        token_scores, tokens = _top_tokens(log_probs, n)  # (B*k, n)
        candidates = (scores[:, None] + token_scores).view(batch, k * n)
        best, flat = torch.topk(candidates, k, dim=-1)  # (B, k)
        parent = flat // n + torch.arange(batch, device=device)[:, None] * k
        parent, best = parent.view(-1), best.view(-1)
        token = tokens.view(batch, k * n).gather(1, flat).view(-1)

        was_finished = finished[parent]
        cache.select(parent, same_sources=True)  # parents are hypotheses of the same example
        prefix = torch.cat([prefix[parent], token[:, None]], dim=1)
        scores = best
        lengths = lengths[parent] + (~was_finished).long()
        finished = was_finished | (token == eos_id)
        if bool(finished.all()) or (early and _settled(scores, lengths, finished, batch,
                                                       length_penalty, lp_longest)):
            break

    normalized = (scores / length_penalty_factor(lengths, length_penalty)).view(batch, k)
    winner = normalized.argmax(dim=-1) + torch.arange(batch, device=device) * k
    return prefix[winner, 1:]


def _settled(scores: Tensor, lengths: Tensor, finished: Tensor, batch: int, alpha: float,
             lp_longest: float) -> bool:
    """True when, in every example, the best finished hypothesis beats the best that any running
    one can still reach (its score, which only falls, over the largest length penalty)."""
    normalized = scores / length_penalty_factor(lengths, alpha)
    best_finished = torch.where(finished, normalized, float("-inf")).view(batch, -1).amax(-1)
    best_running = torch.where(finished, float("-inf"), scores / lp_longest).view(batch, -1).amax(-1)
    return bool((best_running < best_finished).all())


def strip_generated(ids: Tensor, eos_id: int, pad_id: int) -> list[list[int]]:
    """Token ids of each generated row, up to (not including) the first EOS, padding removed."""
    rows = []
    for row in ids.tolist():
        if eos_id in row:
            row = row[: row.index(eos_id)]
        rows.append([t for t in row if t != pad_id])
    return rows


# --------------------------------------------------------------------------------------------
# Decoder-only models: continue a prompt
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def sample(
    model,
    prompt_ids: Tensor,
    *,
    max_new_tokens: int,
    top_k: int | None = None,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    cache=None,
) -> Tensor:
    """Continue each prompt (B, P) by `max_new_tokens` tokens: greedy when `top_k` is None (the
    same `_top_tokens` choice as greedy_decode), else sampled from the `top_k` most likely tokens
    at `temperature` (drawn with `generator`, so a seeded generator gives the same sample).

    The prompt is fed one token per step through the model's cache (`model.start_decoding()`
    unless `cache` is given). Returns the new tokens (B, max_new_tokens).
    """
    if max_new_tokens < 1 or prompt_ids.shape[1] < 1:
        raise ConfigError(f"sampling needs a prompt and max_new_tokens >= 1 (got {max_new_tokens})")
    if (top_k is not None and top_k < 1) or temperature <= 0:
        raise ConfigError(f"top_k={top_k} must be >= 1 (or null: greedy) and temperature={temperature} > 0")
    limit = getattr(model, "max_positions", None)
    needed = prompt_ids.shape[1] + max_new_tokens - 1  # the last new token is not fed back
    if limit is not None and needed > limit:
        raise ConfigError(
            f"a prompt of {prompt_ids.shape[1]} tokens and {max_new_tokens} new ones need {needed} "
            f"positions but the model has {limit}; shorten the prompt or the continuation"
        )
    cache = model.start_decoding() if cache is None else cache
    for t in range(prompt_ids.shape[1] - 1):
        model.decode_step(prompt_ids[:, t], cache)
    token, generated = prompt_ids[:, -1], []
    for _ in range(max_new_tokens):
        log_probs = _next_log_probs(model, token, cache)
        if top_k is None:
            token = _top_tokens(log_probs, 1)[1].squeeze(-1)
        else:
            scores, candidates = _top_tokens(log_probs / temperature, min(top_k, log_probs.shape[-1]))
            pick = torch.multinomial(scores.softmax(-1), 1, generator=generator)
            token = candidates.gather(1, pick).squeeze(1)
        generated.append(token)
    return torch.stack(generated, dim=1)
