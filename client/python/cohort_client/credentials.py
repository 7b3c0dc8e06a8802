"""A cohort credentials file: YAML with the keys coordinator, ca_certificate and token.

The format and the lookup order are worker/base/credentials_file.{h,cc}'s:
    coordinator: 10.0.0.1:7070
    ca_certificate: |
      -----BEGIN CERTIFICATE-----
      ...
    token: 3f9c...
The coordinator writes the first admin's to <data_dir>/admin.credentials; `cohort user add NAME`
prints one per user. Found by an explicit path, else $COHORT_CREDENTIALS, else
~/.config/cohort/credentials.
"""

import collections
import os

import yaml

from cohort_client.errors import CohortError

# The environment variable naming a credentials file (kCredentialsEnv).
CREDENTIALS_ENV = "COHORT_CREDENTIALS"
# Under $HOME (kDefaultCredentialsPath).
DEFAULT_CREDENTIALS_PATH = ".config/cohort/credentials"
# Larger files are refused before parsing; a credentials file is about 1 KiB
# (kMaxCredentialsFileBytes).
MAX_CREDENTIALS_FILE_BYTES = 64 * 1024

_KEYS = ("coordinator", "ca_certificate", "token")

Credentials = collections.namedtuple("Credentials", _KEYS)
Credentials.__doc__ = "coordinator: HOST:PORT; ca_certificate: the cluster CA (PEM); token: the bearer token."


def credentials_path(path=None):
    """The file to use: `path` if given, else $COHORT_CREDENTIALS, else ~/.config/cohort/credentials.

    Empty when none is given and HOME is unset.
    """
    if path:
        return os.fspath(path)
    if os.environ.get(CREDENTIALS_ENV):
        return os.environ[CREDENTIALS_ENV]
    if os.environ.get("HOME"):
        return os.path.join(os.environ["HOME"], DEFAULT_CREDENTIALS_PATH)
    return ""


def parse_credentials(text, source):
    """Parses the YAML `text`; `source` (a path) labels errors. Raises CohortError(INVALID_ARGUMENT)."""
    if len(text) > MAX_CREDENTIALS_FILE_BYTES:
        raise CohortError(
            "INVALID_ARGUMENT",
            f"{source}: {len(text)} bytes is larger than a credentials file can be "
            f"({MAX_CREDENTIALS_FILE_BYTES} bytes, MAX_CREDENTIALS_FILE_BYTES); is it the right file?")
    try:
        # BaseLoader keeps every value as the text written, as yaml-cpp does (a token of digits
        # stays a string).
        root = yaml.load(text, Loader=yaml.BaseLoader)
    except yaml.YAMLError as error:
        raise CohortError("INVALID_ARGUMENT", f"{source}: not YAML: {error}") from None
    if not isinstance(root, dict):
        raise CohortError(
            "INVALID_ARGUMENT",
            f"{source}: a credentials file is a YAML mapping with keys coordinator, ca_certificate and token")
    values = {}
    for key, value in root.items():
        if key not in _KEYS:
            raise CohortError(
                "INVALID_ARGUMENT",
                f"{source}: unknown key {key!r}; a credentials file has coordinator, ca_certificate and token")
        if not isinstance(value, str):
            raise CohortError("INVALID_ARGUMENT", f"{source}: {key} must be a string")
        values[key] = value
    for key in _KEYS:
        if not values.get(key):
            raise CohortError("INVALID_ARGUMENT", f"{source}: {key} is missing or empty")
    return Credentials(**values)


def load_credentials(path=None):
    """Reads and parses the credentials file that credentials_path(path) names.

    Raises CohortError(NOT_FOUND) naming the file, and how to get one, when it cannot be read.
    """
    resolved = credentials_path(path)
    try:
        with open(resolved, "rb") as file:
            data = file.read(MAX_CREDENTIALS_FILE_BYTES + 1)
    except OSError as error:
        raise CohortError(
            "NOT_FOUND",
            f"cannot read the credentials file {resolved!r} ({error.strerror}); pass its path or set "
            f"{CREDENTIALS_ENV} (an admin makes one with `cohort user add NAME`; the first admin's is "
            "<data_dir>/admin.credentials on the coordinator)") from None
    if len(data) > MAX_CREDENTIALS_FILE_BYTES:
        raise CohortError(
            "INVALID_ARGUMENT",
            f"{resolved}: larger than a credentials file can be ({MAX_CREDENTIALS_FILE_BYTES} bytes, "
            "MAX_CREDENTIALS_FILE_BYTES); is it the right file?")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CohortError("INVALID_ARGUMENT", f"{resolved}: not UTF-8 text; is it the right file?") from None
    return parse_credentials(text, resolved)
