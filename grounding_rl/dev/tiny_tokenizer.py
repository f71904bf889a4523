"""A small byte-level BPE tokenizer with Qwen2.5-VL's special tokens and chat template, trained locally.

Used by ``grounding-rl tiny-model`` when no real tokenizer is given, so the demo runs with no downloads and a vocabulary
of about a thousand tokens (the real one has 151,665, whose embedding and output layer would dominate a tiny model's
compute). The pipeline is Qwen2's own (:class:`transformers.Qwen2Tokenizer`: NFC, the Qwen2 split regex that keeps
every digit a token of its own, byte-level BPE), only the merges are learned here, from the text the demo needs:
the ``default`` and ``timezero`` prompt templates (:data:`CORPUS_TEMPLATES`: fixed, so templates added later leave the
demo's tokenizer and its measured results unchanged), Qwen's default system prompt, the demo queries, the
think/answer tags and the SFT target.
Special tokens follow the BPE vocabulary in Qwen's order, so ``<|endoftext|>`` is id ``V``, ``<|im_start|>`` ``V+1``,
and so on (:data:`SPECIAL_TOKENS`).
"""
from __future__ import annotations

# Qwen2.5-VL's added tokens, in id order (../shared/models/Qwen2.5-VL-7B-Instruct/tokenizer_config.json, 151643+).
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
)

# Qwen2.5-VL-Instruct's chat template (../shared/models/Qwen2.5-VL-7B-Instruct/chat_template.json), verbatim.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)

# Generic words and phrases (answers, reasoning, common English) so that text outside the demo still gets sensible
# merges; unseen words fall back to bytes, never to an unknown token.
EXTRA_TEXT = (
    "You are a helpful assistant.",
    "<answer>12.54 to 17.83</answer> <timestep>3.50</timestep> 0.00 to 10.00 seconds second start end time period",
    "a person the man a woman is are was sitting down in a chair eating some food opens the door picks up the phone "
    "walks runs plays holds puts takes turns on off looks at with and of for from into out then after before while",
    "red green blue yellow purple orange white cyan black gray circle square triangle cross shape appears shown "
    "visible moves left right top bottom",
)

VOCAB_SIZE = 4096


CORPUS_TEMPLATES = ("default", "timezero")


def training_corpus() -> list[str]:
    """The texts the tokenizer is trained on (see the module docstring); deterministic."""
    from grounding_rl.dev.demo import demo_queries
    from grounding_rl.prompts.templates import answer_text, instruction

    texts = list(EXTRA_TEXT)
    for name in CORPUS_TEMPLATES:
        texts += [instruction(q, name) for q in demo_queries()]
    texts += demo_queries()
    texts += [answer_text(a / 2, b / 2) for a in range(0, 40, 3) for b in range(a + 1, 41, 4)]
    return texts


def train_bpe(texts: list[str], vocab_size: int = VOCAB_SIZE) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train byte-level BPE merges with Qwen2's normalizer and pre-tokenizer.

    Args:
        texts: training texts.
        vocab_size: upper bound on the BPE vocabulary (256 byte tokens + merges); training stops earlier when no pair
            occurs at least twice.

    Returns:
        (vocab {token: id}, merges [(left, right)]) for :class:`transformers.Qwen2Tokenizer`.
    """
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tokenizer = Tokenizer(BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tokenizer.train_from_iterator(texts, trainer=trainer)
    import json

    model = json.loads(tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return dict(model["vocab"]), merges


def build_tokenizer(vocab_size: int = VOCAB_SIZE):
    """A :class:`transformers.Qwen2Tokenizer` with the locally trained merges, Qwen's special tokens (appended after the
    BPE vocabulary, in Qwen's order), eos ``<|im_end|>``, pad ``<|endoftext|>`` and Qwen's chat template."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = train_bpe(training_corpus(), vocab_size)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab, merges=merges, unk_token=None, bos_token=None, eos_token="<|endoftext|>",
        pad_token="<|endoftext|>", errors="replace", clean_up_tokenization_spaces=False, split_special_tokens=False,
        model_max_length=32768,
    )
    # Added in Qwen's order, so <|endoftext|> = V, <|im_start|> = V + 1, <|im_end|> = V + 2, ...; eos is then set to
    # <|im_end|> (the end of an assistant turn), as in Qwen2.5-VL-Instruct.
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS], special_tokens=True)
    tokenizer.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def special_token_ids(tokenizer) -> dict[str, int]:
    """The config ids the model needs (keys as :data:`grounding_rl.dev.tiny.QWEN_TOKEN_IDS`).

    Raises:
        ValueError: a Qwen special token is missing from the tokenizer.
    """
    ids = {}
    for key, token in (("bos_token_id", "<|endoftext|>"), ("eos_token_id", "<|im_end|>"),
                       ("pad_token_id", "<|endoftext|>"), ("vision_start_token_id", "<|vision_start|>"),
                       ("vision_end_token_id", "<|vision_end|>"), ("image_token_id", "<|image_pad|>"),
                       ("video_token_id", "<|video_pad|>")):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or tokenizer.convert_ids_to_tokens(token_id) != token:
            raise ValueError(f"tokenizer has no {token}")
        ids[key] = int(token_id)
    return ids


def build_processor(vocab_size: int = VOCAB_SIZE, min_pixels: int = 3136, max_pixels: int = 12845056, like=None):
    """A ``Qwen2_5_VLProcessor`` around the locally trained tokenizer, with Qwen's image/video processor settings; or,
    with ``like`` (a loaded processor of a real model folder), a processor of ``like``'s class with its image/video
    processors and chat template around the locally trained tokenizer (e.g. a Qwen3-VL processor with a small
    vocabulary).

    Args:
        vocab_size: BPE vocabulary bound (see :func:`train_bpe`).
        min_pixels, max_pixels: the image/video processors' resize bounds (Qwen2.5-VL's defaults; our pipeline passes
            frames already resized, ``do_resize=False``). Ignored with ``like``.
        like: a real processor whose class, image/video processors and chat template are kept.

    Returns:
        the processor, with ``processor.token_ids`` (dict: bos/eos/pad/vision_start/vision_end/image/video ids, keys as
        :data:`grounding_rl.dev.tiny.QWEN_TOKEN_IDS`). ``save_pretrained`` writes files that
        ``AutoProcessor.from_pretrained`` reloads offline (``token_ids`` is not saved; recompute it with
        :func:`special_token_ids`).
    """
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    tokenizer = build_tokenizer(vocab_size)
    if like is not None:
        processor = type(like)(image_processor=like.image_processor, tokenizer=tokenizer,
                               video_processor=like.video_processor, chat_template=like.chat_template)
        processor.token_ids = special_token_ids(tokenizer)
        return processor
    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    mean, std = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size, image_mean=mean, image_std=std),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(size=size, image_mean=mean, image_std=std),
        chat_template=CHAT_TEMPLATE,
    )
    processor.token_ids = special_token_ids(tokenizer)
    return processor
