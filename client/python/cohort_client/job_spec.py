"""Job specs, from a YAML file or a Python dict, to cohort.v1.JobSpec.

The same format as the `cohort` CLI's (client/job_spec_yaml.{h,cc}), read by the same rules, so a
file that `cohort submit` accepts is accepted here and means the same job:
  - the keys are exactly the proto field names (snake_case); the mapping follows the message
    descriptors, so a field added to job.proto is readable with no change here;
  - enums are written lowercase without their type prefix (dataset.kind: synthetic; optimizer.kind:
    sgd); the *_UNSPECIFIED zero values are not accepted;
  - a repeated scalar field (command, rank_in, input_shape) takes a list, a single value, or null;
  - a map field (env) takes a mapping of names to values;
  - null for any other field leaves it unset; a message key with nothing under it (data_parallel:)
    still selects it;
  - at most one member of a oneof (data_parallel / model_parallel; graph / torchscript_file).

Every problem is reported, one per line, naming the file, line and column (for files), the field
path and the value, and what to do; they come together in one CohortError(INVALID_ARGUMENT):
    job.yaml:12:5: optimizer.kind: 'sgdd' is not one of sgd, momentum, adam

A dict may hold Python values (3, 0.05, True, None, lists, dicts) or the text a YAML file would
hold ("3"); its errors are labelled "<dict>" and have no line numbers. These are structural checks
only: what the values mean is checked by the coordinator at submit.
"""

import math
import os
import re

import yaml
from google.protobuf import descriptor as _descriptor

from cohort.v1 import job_pb2
from cohort_client.errors import CohortError

_FD = _descriptor.FieldDescriptor
# A key closer than this (edits) to a valid one gets a "did you mean" hint
# (kMaxSuggestionDistance).
MAX_SUGGESTION_DISTANCE = 2
# The label of a dict spec's errors.
DICT_SOURCE = "<dict>"

_NULL_TAG = "tag:yaml.org,2002:null"
_INTEGER = re.compile(r"[+-]?[0-9]+\Z")
# strtod's decimal forms; hex, "inf" and "nan" are refused as the C++ reader refuses them.
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\Z")
_SPECIAL_DOUBLES = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}
# YAML 1.1's booleans, as yaml-cpp reads them.
_TRUE = {"true", "yes", "on", "y"}
_FALSE = {"false", "no", "off", "n"}
_INT_RANGES = {
    _FD.CPPTYPE_INT32: (-(2**31), 2**31 - 1, "a 32-bit whole number"),
    _FD.CPPTYPE_INT64: (-(2**63), 2**63 - 1, "a 64-bit whole number"),
    _FD.CPPTYPE_UINT32: (0, 2**32 - 1, "a non-negative 32-bit whole number"),
    _FD.CPPTYPE_UINT64: (0, 2**64 - 1, "a non-negative 64-bit whole number"),
}


# ---- enum names ----------------------------------------------------------------------------------


def _enum_value_prefix(enum_type):
    """DatasetKind -> DATASET_KIND_: the prefix proto style puts on an enum's values."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", enum_type.name).upper() + "_"


def _is_unspecified(value):
    return value.number == 0 and value.name.endswith("_UNSPECIFIED")


def yaml_enum_name(value):
    """The YAML spelling of an enum value: FASHION_MNIST -> fashion_mnist, DATASET_KIND_X -> x."""
    name = value.name
    prefix = _enum_value_prefix(value.type)
    if len(name) > len(prefix) and name.startswith(prefix):
        name = name[len(prefix):]
    return name.lower()


def _yaml_enum_names(enum_type):
    return [yaml_enum_name(v) for v in enum_type.values if not _is_unspecified(v)]


# ---- small helpers -------------------------------------------------------------------------------


def _edit_distance(a, b):
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        diagonal, row[0] = row[0], i
        for j in range(1, len(b) + 1):
            above = row[j]
            row[j] = min(row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1]))
            diagonal = above
    return row[len(b)]


def _is_null(node):
    return isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG


def _node_kind(node):
    if _is_null(node):
        return "nothing (null)"
    if isinstance(node, yaml.ScalarNode):
        return f"'{node.value}'"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return "a mapping"


def _field_names(message_type):
    return [f.name for f in message_type.fields]


def _child_path(path, name):
    return f"{path}.{name}" if path else name


def _is_map(field):
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _real_oneof(field):
    """The field's oneof, unless it is the synthetic one a proto3 `optional` field sits in."""
    oneof = field.containing_oneof
    if oneof is None or (len(oneof.fields) == 1 and oneof.name == "_" + field.name):
        return None
    return oneof


def _scalar_expectation(field):
    return {
        _FD.CPPTYPE_INT32: "a whole number such as 3",
        _FD.CPPTYPE_INT64: "a whole number such as 3",
        _FD.CPPTYPE_UINT32: "a non-negative whole number such as 3",
        _FD.CPPTYPE_UINT64: "a non-negative whole number such as 3",
        _FD.CPPTYPE_DOUBLE: "a number such as 0.05",
        _FD.CPPTYPE_FLOAT: "a number such as 0.05",
        _FD.CPPTYPE_BOOL: "true or false",
        _FD.CPPTYPE_STRING: "a string",
        _FD.CPPTYPE_ENUM: "one name",
        _FD.CPPTYPE_MESSAGE: "a mapping",
    }.get(field.cpp_type, "a value")


def _parse_double(text):
    lower = text.lower()
    if lower in _SPECIAL_DOUBLES:
        return _SPECIAL_DOUBLES[lower]
    if not _DECIMAL.match(text):
        return None
    value = float(text)
    # strtod's ERANGE: too large for a double, or a non-zero value too small for one.
    if math.isinf(value) or (value == 0.0 and re.search(r"[1-9]", text.split("e")[0].split("E")[0])):
        return None
    return value


def _to_plain(value):
    """Tuples (a command given as a tuple) become lists, which YAML's representer knows."""
    if isinstance(value, tuple):
        return [_to_plain(v) for v in value]
    if isinstance(value, list):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


# ---- reading -------------------------------------------------------------------------------------


class _Reader:
    """Walks a YAML node tree alongside a message's descriptor, collecting every problem."""

    def __init__(self, source):
        self.source = source
        self.problems = []

    def error(self, mark, path, text):
        where = self.source
        if mark is not None:
            where += f":{mark.line + 1}:{mark.column + 1}"
        self.problems.append(f"{where}: {path}: {text}" if path else f"{where}: {text}")

    def read_message(self, node, message, path):
        message_type = message.DESCRIPTOR
        if _is_null(node):
            return  # `checkpoint:` with nothing under it: the message at its defaults
        if not isinstance(node, yaml.MappingNode):
            self.error(node.start_mark, path,
                       f"{_node_kind(node)} is not a mapping; expected keys such as "
                       f"{', '.join(_field_names(message_type))}")
            return
        seen = {}
        oneof_member = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or _is_null(key):
                self.error(key.start_mark, path,
                           f"a key is {_node_kind(key)}; keys are field names such as "
                           f"{', '.join(_field_names(message_type))}")
                continue
            name = key.value
            field = message_type.fields_by_name.get(name)
            if field is None:
                self._unknown_key(key, message_type, path)
                continue
            field_path = _child_path(path, name)
            if name in seen:
                first = seen[name]
                line = f" (first on line {first.line + 1})" if first is not None else ""
                self.error(key.start_mark, field_path, f"is given twice{line}; keep one")
                continue
            seen[name] = key.start_mark
            oneof = _real_oneof(field)
            if oneof is not None:
                if oneof.name in oneof_member:
                    self.error(key.start_mark, field_path,
                               f"{oneof_member[oneof.name]} and {name} are both set, but a spec takes only "
                               f"one of them (oneof {oneof.name}); remove one")
                    continue
                oneof_member[oneof.name] = name
            self._read_field(value, value.start_mark or key.start_mark, message, field, field_path)

    def _unknown_key(self, key, message_type, path):
        valid = _field_names(message_type)
        hint = ""
        best = MAX_SUGGESTION_DISTANCE + 1
        for candidate in valid:
            distance = _edit_distance(key.value, candidate)
            if distance < best:
                best, hint = distance, f" (did you mean '{candidate}'?)"
        where = f"'{path}'" if path else "a job spec"
        self.error(key.start_mark, path,
                   f"unknown key '{key.value}'{hint}; the keys of {where} are: {', '.join(valid)}")

    def _read_field(self, value, mark, message, field, path):
        is_message = field.cpp_type == _FD.CPPTYPE_MESSAGE
        if _is_map(field):
            return self._read_map(value, mark, message, field, path)
        if field.label != _FD.LABEL_REPEATED:
            if is_message:
                child = getattr(message, field.name)
                # Selected even when null, so `data_parallel:` alone picks the oneof member.
                child.SetInParent()
                self.read_message(value, child, path)
            elif not _is_null(value):
                self._read_scalar(value, mark, message, field, path)
            return
        if _is_null(value):
            return  # `rank_in:` / `rank_in: null`: empty
        if isinstance(value, yaml.SequenceNode):
            for i, element in enumerate(value.value):
                element_path = f"{path}[{i}]"
                element_mark = element.start_mark or mark
                if is_message:
                    self.read_message(element, getattr(message, field.name).add(), element_path)
                elif _is_null(element):
                    self.error(element_mark, element_path, f"is null; expected {_scalar_expectation(field)}")
                else:
                    self._read_scalar(element, element_mark, message, field, element_path)
            return
        if is_message:
            self.error(mark, path,
                       f"{_node_kind(value)} is not a list; expected a list of mappings (one per entry, "
                       "'- key: value')")
            return
        self._read_scalar(value, mark, message, field, path)  # a single value: a one-element list

    def _read_map(self, value, mark, message, field, path):
        """A proto map (env): a mapping of names to values; a key given twice is an error."""
        if _is_null(value):
            return
        if not isinstance(value, yaml.MappingNode):
            self.error(mark, path,
                       f"{_node_kind(value)} is not a mapping; write one `NAME: value` per line under "
                       f"{field.name}")
            return
        key_field = field.message_type.fields_by_name["key"]
        value_field = field.message_type.fields_by_name["value"]
        entries = getattr(message, field.name)
        seen = {}
        for key, item in value.value:
            if not isinstance(key, yaml.ScalarNode):
                self.error(key.start_mark or mark, path, f"a key is {_node_kind(key)}; keys are names")
                continue
            entry_path = f"{path}.{key.value}"
            if key.value in seen:
                first = seen[key.value]
                line = f" (first on line {first.line + 1})" if first is not None else ""
                self.error(key.start_mark, entry_path, f"is given twice{line}; keep one")
                continue
            seen[key.value] = key.start_mark
            if _is_null(item):
                self.error(item.start_mark or key.start_mark, entry_path,
                           f'has no value; write `{key.value}: ""` for an empty one')
                continue
            parsed_key = self._scalar_value(key, key.start_mark or mark, key_field, entry_path)
            parsed_value = self._scalar_value(item, item.start_mark or key.start_mark, value_field, entry_path)
            if parsed_key is not None and parsed_value is not None:
                entries[parsed_key] = parsed_value

    def _read_scalar(self, value, mark, message, field, path):
        parsed = self._scalar_value(value, mark, field, path)
        if parsed is None:
            return
        if field.label == _FD.LABEL_REPEATED:
            getattr(message, field.name).append(parsed)
        else:
            setattr(message, field.name, parsed)

    def _scalar_value(self, value, mark, field, path):
        """The Python value of one scalar node for `field`, or None after reporting a problem."""
        if not isinstance(value, yaml.ScalarNode):
            expected = _scalar_expectation(field)
            if field.cpp_type == _FD.CPPTYPE_ENUM:
                expected = "one of " + ", ".join(_yaml_enum_names(field.enum_type))
            repeated = " or a list of them" if field.label == _FD.LABEL_REPEATED else ""
            self.error(mark, path, f"{_node_kind(value)} is not a single value; expected {expected}{repeated}")
            return None
        text = value.value
        cpp_type = field.cpp_type

        def wrong_type():
            self.error(mark, path, f"'{text}' is not {_scalar_expectation(field)}")

        if cpp_type in _INT_RANGES:
            low, high, what = _INT_RANGES[cpp_type]
            if not _INTEGER.match(text):
                return wrong_type()
            number = int(text)
            if number < 0 and low == 0:
                return self.error(mark, path, f"'{text}' is negative; expected {_scalar_expectation(field)}")
            if not low <= number <= high:
                return self.error(mark, path, f"'{text}' is out of range; expected {what} ({low} .. {high})")
            return number
        if cpp_type in (_FD.CPPTYPE_DOUBLE, _FD.CPPTYPE_FLOAT):
            number = _parse_double(text)
            return wrong_type() if number is None else number
        if cpp_type == _FD.CPPTYPE_BOOL:
            lower = text.lower()
            if lower in _TRUE:
                return True
            if lower in _FALSE:
                return False
            return wrong_type()
        if cpp_type == _FD.CPPTYPE_STRING:
            if field.type == _FD.TYPE_BYTES:
                return text.encode("utf-8", "surrogateescape")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return self.error(mark, path, "the value is not valid UTF-8; write the file in UTF-8")
            return text
        if cpp_type == _FD.CPPTYPE_ENUM:
            for candidate in field.enum_type.values:
                if not _is_unspecified(candidate) and yaml_enum_name(candidate) == text:
                    return candidate.number
            return self.error(mark, path,
                              f"'{text}' is not one of {', '.join(_yaml_enum_names(field.enum_type))}")
        return wrong_type()


def _job_spec_from_node(root, source):
    if root is None or _is_null(root):
        raise CohortError(
            "INVALID_ARGUMENT",
            f"{source}: the file holds no job spec; write a mapping with keys such as "
            f"{', '.join(_field_names(job_pb2.JobSpec.DESCRIPTOR))}")
    reader = _Reader(source)
    spec = job_pb2.JobSpec()
    reader.read_message(root, spec, "")
    if reader.problems:
        raise CohortError("INVALID_ARGUMENT", "\n".join(reader.problems))
    return spec


def parse_job_spec_yaml(text, source="<string>"):
    """Parses YAML text into a JobSpec; `source` labels errors. Raises CohortError(INVALID_ARGUMENT)."""
    try:
        # Composed, not constructed: the nodes keep their line and column, duplicate keys, and the
        # text of every scalar (a string field takes `name: 007` as "007", as the CLI does).
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        raise CohortError(
            "INVALID_ARGUMENT",
            f"{where}: YAML syntax error: {error.problem or error.context}; fix the file's indentation, "
            "quoting or brackets") from None
    except yaml.YAMLError as error:
        raise CohortError("INVALID_ARGUMENT", f"{source}: YAML error: {error}") from None
    return _job_spec_from_node(root, source)


def load_job_spec_file(path):
    """Reads and parses a YAML job file. Raises CohortError: NOT_FOUND naming the path when it cannot
    be read, INVALID_ARGUMENT as parse_job_spec_yaml, with errors labelled by the path."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise CohortError("INVALID_ARGUMENT", f"job spec file {path} is a directory; give the path of a .yaml file")
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise CohortError("NOT_FOUND",
                          f"cannot read job spec file {path}: {error.strerror}; check the path") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CohortError("INVALID_ARGUMENT",
                          f"{path}: byte {error.start} is not valid UTF-8; write the file in UTF-8") from None
    return parse_job_spec_yaml(text, path)


def job_spec_from_dict(spec):
    """Maps a dict (as a YAML file would hold it) onto a JobSpec. Raises CohortError(INVALID_ARGUMENT)."""
    if not isinstance(spec, dict):
        raise CohortError("INVALID_ARGUMENT", f"{DICT_SOURCE}: a job spec is a dict, not {type(spec).__name__}")
    try:
        root = yaml.representer.SafeRepresenter(sort_keys=False).represent_data(_to_plain(spec))
    except yaml.representer.RepresenterError as error:
        raise CohortError(
            "INVALID_ARGUMENT",
            f"{DICT_SOURCE}: {error}; a job spec holds only str, int, float, bool, None, lists and dicts") from None
    return _job_spec_from_node(root, DICT_SOURCE)


def to_job_spec(spec):
    """A JobSpec from a JobSpec (returned as is), a dict, or the path of a YAML file (str or PathLike)."""
    if isinstance(spec, job_pb2.JobSpec):
        return spec
    if isinstance(spec, dict):
        return job_spec_from_dict(spec)
    if isinstance(spec, (str, os.PathLike)):
        return load_job_spec_file(spec)
    raise CohortError(
        "INVALID_ARGUMENT",
        f"a job spec is a dict, the path of a YAML file or a cohort.v1.JobSpec, not {type(spec).__name__}")
