"""Chat templates with tool support, written for the tests in the two formats the engine parses, and
a tokenizer folder of the default model with one of them (the default model's own template has no
tools). The wording is ours; the formats follow the model families' published templates."""

from __future__ import annotations

from pathlib import Path

# Hermes / Qwen2.5 style: tools in the system turn, calls in <tool_call> tags, results in <tool_response>
HERMES_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You can call functions. Their signatures:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
To call one, reply with a JSON object inside tags:
<tool_call>
{"name": <function-name>, "arguments": <arguments-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{% if message.content %}{{ message.content }}
{% endif %}{% for call in message.tool_calls %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Llama 3.1 / 3.2 JSON style: tools in the first user turn, a call is the whole reply as
# {"name": ..., "parameters": ...}, results come back in the ipython role
LLAMA31_TEMPLATE = """\
{{- bos_token }}
{%- for message in messages %}
{%- if message.role == 'user' and loop.first and tools %}<|start_header_id|>user<|end_header_id|>

Answer with a function call as JSON {"name": function name, "parameters": arguments}. Functions:
{% for t in tools %}{{ t | tojson(indent=4) }}

{% endfor %}{{ message.content }}<|eot_id|>
{%- elif message.role == 'assistant' and message.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{%- for call in message.tool_calls %}<|python_tag|>{"name": "{{ call.function.name }}", "parameters": {{ call.function.arguments | tojson }}}{% endfor %}<|eom_id|>
{%- elif message.role in ('tool', 'ipython') %}<|start_header_id|>ipython<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""


def tokenizer_folder(gguf: Path, out: Path, template: str) -> Path:
    """The default model's tokenizer, saved as a folder whose chat template is `template`."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    hf.chat_template = template
    hf.save_pretrained(str(out))
    return out
