"""URIs as distppo prints them: with any credentials in them replaced by `***`.

A storage or tracking URI may carry credentials: the user information of
`s3://KEY:SECRET@bucket/...` or `http://user:token@mlflow:5000`, and query values such as
pyarrow's `?access_key=...&secret_key=...&session_token=...` or a presigned URL's
`X-Amz-Signature`. distppo keeps the URI as given for the file systems and trackers that need
it, and passes every URI it prints (log lines, errors, the sweep summary, the report) through
`redact`, or a whole line through `redact_text`, so a log shared in an issue or a CI job leaks
none of them.
"""
from __future__ import annotations

import re
from typing import Mapping

from distppo.errors import UserError

MASK = "***"
# query keys whose values are secrets: pyarrow's S3 options (access_key, secret_key,
# session_token), AWS presigned URLs (X-Amz-Credential, X-Amz-Signature, X-Amz-Security-Token),
# Azure SAS (sig), and the usual names of passwords, tokens and API keys
SECRET_KEY_PARTS = ("secret", "password", "passwd", "token", "key", "credential", "signature",
                    "auth")
SECRET_KEYS = {"sig", "pwd", "pass"}
# scheme://userinfo@ : everything between `//` and the first `@` before the query; `/` allowed,
# since an AWS secret key holds `/` and people paste it unencoded (a path with `@` in it loses
# a little more than needed, never a secret)
USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^?#@]*@")
# a URI inside free text: a scheme, `://`, then up to whitespace or a quote, less the
# punctuation that ends a clause after it ("storage s3://b/x: denied")
URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"`<>]*[^\s'\"`<>.,;:)\]]")


def _secret_key(key: str) -> bool:
    key = key.lower()
    return key in SECRET_KEYS or any(part in key for part in SECRET_KEY_PARTS)


def _redact_query(query: str) -> str:
    pairs = []
    for pair in query.split("&"):
        key, eq, value = pair.partition("=")
        pairs.append(f"{key}={MASK}" if eq and value and _secret_key(key) else pair)
    return "&".join(pairs)


def redact(uri: str) -> str:
    """`uri` with its user information and secret query values replaced by `***`; the rest
    (scheme, host, path, other query options) unchanged, and a plain path returned as it is."""
    if "://" not in uri:
        return uri
    uri = USERINFO.sub(rf"\g<1>{MASK}@", uri, count=1)
    base, sep, rest = uri.partition("?")
    if not sep:
        return uri
    query, hash_sign, fragment = rest.partition("#")
    return f"{base}?{_redact_query(query)}{hash_sign}{fragment}"


def redact_text(text: str) -> str:
    """Every URI inside a line of text (an error message that quotes one) redacted."""
    return URI_IN_TEXT.sub(lambda m: redact(m.group(0)), text)


def redact_config(value):
    """A config as distppo stores it (config.json, sweep.json, TensorBoard's hyperparameter
    text, the W&B config, MLflow params): every string with its URIs redacted, at any depth.
    The one function every such writer calls, so no stored file keeps a credential; the
    process itself keeps the URI as given."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {key: redact_config(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_config(item) for item in value)
    return value


def masked(value) -> bool:
    """Whether a stored value had credentials masked by redact (`//***@` or `=***`)."""
    return isinstance(value, str) and (f"//{MASK}@" in value or f"={MASK}" in value)


def given_again(stored: Mapping, given: Mapping, source: str) -> dict:
    """The values of a stored flat config that were masked when stored, as `given` supplies
    them again (a value that redacts to the stored one); a masked value not given is a
    UserError naming the flag, since a run cannot go on with `***` for a credential."""
    out = {}
    for key, value in stored.items():
        if not masked(value):
            continue
        again = given.get(key)
        if isinstance(again, str) and redact_text(again) == value:
            out[key] = again
        elif again is None:
            flag = "--" + key.replace("_", "-")
            raise UserError(f"{source} holds {flag} {value} with its credentials masked: give "
                            f"{flag} again with them")
    return out
