"""An RL-style token-in / token-out loop on the default model.

RL trainers want exact token ids: the policy's samples (and their logprobs) are what the
gradient is computed on, so no text round trip may change them. Here each episode:

1. renders the prompt once to token ids (chat template applied by aphro, like vLLM);
2. samples several completions as token ids with their logprobs (`n`, seeded);
3. scores each completion with a toy reward computed on the decoded text;
4. appends the best completion's *ids* to the context for the next turn (no re-tokenization).

    python examples/python/rl_loop.py
"""
import aphro

model = aphro.Model()
renderer = aphro.Renderer(model)
engine = aphro.Engine(model, seed=1234)


def reward(text: str) -> float:
    """Toy reward: short answers that mention a number."""
    has_digit = any(ch.isdigit() for ch in text)
    return (1.0 if has_digit else 0.0) - 0.01 * len(text.split())


context = renderer.render_chat(
    {"messages": [{"role": "user", "content": "Give me a number between 1 and 10."}]}
)["token_ids"]

for episode in range(3):
    response = engine.generate(
        {
            "token_ids": context,
            "sampling_params": {
                "n": 4,
                "max_tokens": 16,
                "temperature": 1.0,
                "logprobs": 0,  # the sampled token's logprob
                "seed": episode,
            },
        }
    )
    scored = []
    for choice in response["choices"]:
        ids = choice["token_ids"]
        logprobs = [entry["logprob"] for entry in (choice.get("logprobs") or {}).get("content") or []]
        text = model.decode(ids, skip_special_tokens=True)
        scored.append((reward(text), ids, sum(logprobs), text))
    scored.sort(key=lambda s: s[0], reverse=True)
    for r, ids, lp, text in scored:
        print(f"episode {episode}  reward {r:+.2f}  logprob {lp:8.2f}  {len(ids):2} ids  {text!r}")
    best_ids = scored[0][1]
    # Token-in / token-out: extend the context with the exact sampled ids (closing the turn
    # with <|im_end|> if the sample was cut by max_tokens), then the next user turn in
    # SmolLM2's ChatML framing, tokenized on its own. Nothing already sampled is re-tokenized.
    if not best_ids or best_ids[-1] not in model.eos_token_ids:
        best_ids = best_ids + model.encode("<|im_end|>", add_special_tokens=False)
    next_turn = model.encode(
        "\n<|im_start|>user\nAnother one, different.<|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    context = context + best_ids + next_turn
    print(f"-- context now {len(context)} tokens")
