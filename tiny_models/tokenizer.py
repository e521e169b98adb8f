"""A small byte-level BPE tokenizer with a ChatML chat template, trained on a fixed corpus.

Every tiny model shares it, so token ids mean the same thing in the policy, the reward
models and the tests. Deterministic: the same corpus and vocabulary size give the same ids.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
STEP_SEPARATOR = "<extra_0>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END, STEP_SEPARATOR]
# Math-Shepherd's step tag and judgement tokens; added as whole tokens so each is one id.
STEP_TAG = "ки"
JUDGEMENT_TOKENS = ["+", "-"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The same ChatML, where a message's content may also be a list of parts rendered in order: an image part
# as the vision-language processors' placeholder ``<image>``, a text part as its text.
PARTS_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "What is 12 + 7? The answer is 19.",
    "Compute 3 * 4 - 5. Step 1: 3 * 4 = 12. Step 2: 12 - 5 = 7. The answer is \\boxed{7}.",
    "<think>\nadd the numbers\n</think>\n<answer>\n42\n</answer>",
    "First, read the question. Second, solve it. Next, check it. Finally, answer.",
    "def solve():\n    print(sum(map(int, input().split())))\n",
    "```python\nx = int(input())\nprint(x * 2)\n```",
    '{"name": "Ada", "age": 36, "tags": ["math", "code"]}',
    "The quick brown fox jumps over the lazy dog. A reward model scores each step.",
    "system user assistant Please reason step by step, and put your final answer within \\boxed{}.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 + - * / = ( ) [ ] { } , . : ; ! ? "
    "#### $ \\frac{1}{2}",
    "reverse the word hello: olleh. sort 3 1 2: 1 2 3. count the letters in cat: 3.",
]


def build_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train the shared BPE tokenizer (``vocab_size`` ids including the specials)."""
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_CORPUS * 20, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START, STEP_SEPARATOR],
    )
    tokenizer.add_tokens([STEP_TAG])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    tokenizer.model_max_length = 512
    return tokenizer
