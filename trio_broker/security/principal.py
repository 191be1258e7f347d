"""The principal of a TLS client: its certificate subject, as Kafka names it. Pure.

Kafka's default principal for an SSL client is ``User:`` + the subject's
distinguished name in RFC 2253 form (``CN=alice,OU=eng,O=Example,C=DE``: most
specific first). ``ssl.principal.mapping.rules`` rewrite that name, as in Kafka::

    RULE:^CN=([a-zA-Z0-9.@_-]+),.*$/$1/L, DEFAULT

A rule is ``RULE:pattern/replacement/`` with an optional ``L`` or ``U`` (lower or
upper case the result); the first rule whose pattern matches the whole name wins;
``DEFAULT`` keeps the name unchanged. When no rule matches, the connection is
refused (:class:`NoMatchingRule`), as Kafka's SslPrincipalMapper does.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

#: Python's attribute names -> the short names RFC 2253 (and Java's X500Principal) use.
SHORT_NAMES = {
    "commonName": "CN", "organizationalUnitName": "OU", "organizationName": "O",
    "localityName": "L", "stateOrProvinceName": "ST", "countryName": "C",
    "streetAddress": "STREET", "domainComponent": "DC", "userId": "UID",
    "emailAddress": "EMAILADDRESS",
}  # fmt: skip
_SPECIAL = re.compile(r'([,+"\\<>;=])')


def _escape(value: str) -> str:
    out = _SPECIAL.sub(r"\\\1", value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def distinguished_name(peer_cert: dict[str, Any]) -> str:
    """RFC 2253 subject of ``ssl.SSLObject.getpeercert()``: last RDN first."""
    rdns = []
    for rdn in reversed(peer_cert.get("subject", ())):
        rdns.append("+".join(f"{SHORT_NAMES.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(rdns)


@attrs.frozen
class Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""  # "", "L" or "U"

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        match = self.pattern.fullmatch(name)
        if match is None:
            return None
        # Kafka's replacements say $1; Python's expand wants \1.
        out = match.expand(re.sub(r"\$(\d+)", r"\\\1", self.replacement))
        return out.lower() if self.case == "L" else out.upper() if self.case == "U" else out


_RULE = re.compile(r"RULE:((?:\\.|[^/\\])*)/((?:\\.|[^/\\])*)/([LU]?)")


def parse_rules(text: str) -> list[Rule]:
    """Parse ``ssl.principal.mapping.rules``; ValueError names the bad part."""
    rules: list[Rule] = []
    rest = (text or "DEFAULT").strip()
    while rest:
        if rest.startswith("DEFAULT"):
            rules.append(Rule(None))
            rest = rest[len("DEFAULT") :]
        else:
            match = _RULE.match(rest)
            if match is None:
                raise ValueError(f"ssl.principal.mapping.rules: cannot parse {rest!r}")
            pattern = re.compile(match.group(1).replace("\\/", "/"))
            rules.append(Rule(pattern, match.group(2).replace("\\/", "/"), match.group(3)))
            rest = rest[match.end() :]
        rest = rest.strip().removeprefix(",").strip()
    return rules


class NoMatchingRule(ValueError):
    """No ssl.principal.mapping.rules rule matches the certificate subject."""


def principal_for(peer_cert: dict[str, Any] | None, rules: list[Rule]) -> str | None:
    """``User:<mapped name>`` for a client certificate, or None without one."""
    if not peer_cert:
        return None
    name = distinguished_name(peer_cert)
    for rule in rules:
        mapped = rule.apply(name)
        if mapped is not None:
            return f"User:{mapped}"
    raise NoMatchingRule(f"no ssl.principal.mapping.rules rule matches {name!r}")
