"""Values Kubernetes restricts, as annotated recipe types: names, label keys and values, quantities.

Each check raises a ValueError whose message says what the rule is, so `llmdeploy validate` shows
the fix next to the field. Quantities are matched against Kubernetes' grammar here rather than with
the kubernetes client's `parse_quantity`: importing it loads the whole generated client (seconds),
which every recipe load would pay.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated

from pydantic import AfterValidator

from llmdeploy.recipe.field_types import checked, is_dns_label, is_dns_subdomain, is_label_name

# Kubernetes' quantity grammar: a signed decimal, then a binary (Ki..Ei), decimal (m..E) or exponent suffix
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
_SUFFIX = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
}


_dns_label = checked(
    is_dns_label,
    lambda v: (
        f"{v!r} is not a DNS label: lower-case letters, digits and '-', starting and ending "
        "with a letter or digit, at most 63 characters"
    ),
)
_dns_subdomain = checked(
    is_dns_subdomain,
    lambda v: (
        f"{v!r} is not a Kubernetes object name (DNS subdomain): lower-case letters, digits, "
        "'-' and '.', starting and ending with a letter or digit, at most 253 characters"
    ),
)
_label_value = checked(
    lambda v: not v or is_label_name(v),
    lambda v: (
        f"label value {v!r}: at most 63 letters, digits, '-', '_' or '.', starting and ending "
        "with a letter or digit (or empty)"
    ),
)


def _qualified_key(value: str) -> str:
    prefix, _, name = value.rpartition("/")
    if prefix and not is_dns_subdomain(prefix):
        raise ValueError(
            f"key {value!r}: the prefix before '/' must be a DNS subdomain, e.g. example.com/team"
        )
    if not is_label_name(name):
        raise ValueError(
            f"key {value!r}: the name part must be at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return value


def _quantity_text(value: str | int | float) -> str:
    text = str(value)
    if isinstance(value, bool) or not _QUANTITY.match(text):
        raise ValueError(
            f"{text!r} is not a Kubernetes quantity: write e.g. '500m' or '2' for CPU, '16Gi' for memory"
        )
    return text


def quantity_value(text: str) -> Decimal:
    """The number a quantity stands for, to compare a request with its limit."""
    match = _QUANTITY.match(text)
    assert match, text
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return number * Decimal(10) ** int(suffix[1:])
    return number * _SUFFIX.get(suffix, Decimal(1))


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
ObjectName = Annotated[str, AfterValidator(_dns_subdomain)]
QualifiedKey = Annotated[str, AfterValidator(_qualified_key)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
Quantity = Annotated[str | int | float, AfterValidator(_quantity_text)]
Labels = dict[QualifiedKey, LabelValue]
Annotations = dict[QualifiedKey, str]
