"""Generate the gRPC API reference ``docs/api.md`` from the ``.proto`` files, or check it.

The protos are compiled with ``grpc_tools.protoc --descriptor_set_out --include_source_info``, so the
reference is built from the same descriptors the services load: every service, RPC (with its admin flag,
the ``(grpo.common.v1.admin)`` method option), message, field and enum, with the comments written in the
protos. Each service also gets the status codes a client can receive (those its comments name, plus the
ones the shared runtime adds) and what to do about each: retry or not.

    python scripts/gen_api_docs.py            # rewrite docs/api.md
    python scripts/gen_api_docs.py --check    # exit 1 (and print a diff) when docs/api.md is stale
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from generated_file import write_or_check
from google.protobuf import descriptor_pb2
from grpc_tools import protoc
from grpo.common.v1 import common_pb2

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROTO_ROOT = REPO_ROOT / "protos"
DEFAULT_OUT = REPO_ROOT / "docs" / "api.md"

# Field numbers inside descriptor.proto, used as SourceCodeInfo paths
# (https://protobuf.dev/reference/protobuf/google.protobuf/#source-code-info).
_FILE_MESSAGE, _FILE_ENUM, _FILE_SERVICE, _FILE_EXTENSION = 4, 5, 6, 7
_MESSAGE_FIELD, _MESSAGE_NESTED, _MESSAGE_ENUM = 2, 3, 4
_ENUM_VALUE = 2
_SERVICE_METHOD = 2

_SCALAR_NAMES = {
    descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE: "double",
    descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT: "float",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64: "int64",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: "uint64",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32: "int32",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED64: "fixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED32: "fixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL: "bool",
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: "string",
    descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: "bytes",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT32: "uint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED32: "sfixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED64: "sfixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT32: "sint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT64: "sint64",
}

# What a client should do with each status code. "Retry" always means with exponential backoff and jitter
# within the caller's overall deadline; grpo_runtime's channels already retry UNAVAILABLE that way.
RETRY_ADVICE = {
    "OK": "Success.",
    "INVALID_ARGUMENT": "Never retry unchanged: the request is wrong. The message names the field or key.",
    "NOT_FOUND": "Do not retry; the named object (model, run) does not exist.",
    "ALREADY_EXISTS": "Do not retry; choose another name or id.",
    "FAILED_PRECONDITION": (
        "Do not retry blindly: fix the state the message describes (e.g. wake the engine), then retry."
    ),
    "UNAUTHENTICATED": (
        "Do not retry; send `authorization: Bearer <admin token>` metadata with the configured token."
    ),
    "RESOURCE_EXHAUSTED": (
        "Retry only when the status carries the `grpc-retry-pushback-ms` trailer (a bound that clears by "
        "itself, such as too many requests in flight), waiting at least that long; the service clients do. "
        "Without it (a message or request above a size limit) do not retry unchanged: split large requests."
    ),
    "UNAVAILABLE": "Retry with backoff: the server is starting, draining or unreachable.",
    "DEADLINE_EXCEEDED": (
        "The client's deadline passed. Retry only RPCs without side effects (Score, ListRewards, Generate, "
        "GetStatus, Get*/List*/Watch*), with a longer deadline if the work is legitimately slow."
    ),
    "CANCELLED": "The client (or a shutting-down server) cancelled the call; retry if you still need it.",
    "INTERNAL": "A server bug (logged there). Do not retry in a loop; report it.",
    "UNIMPLEMENTED": "The server does not offer this RPC (older version); do not retry.",
}

# The "Retry?" column of each service's table: always (with backoff), depending on the situation, or never.
_RETRYABLE = {"UNAVAILABLE"}
_CONDITIONAL = {"DEADLINE_EXCEEDED", "CANCELLED", "FAILED_PRECONDITION"}
# Retried as grpo_runtime.call_errors.ServiceCallError.retryable decides: only with the server's pushback.
_WITH_PUSHBACK = {"RESOURCE_EXHAUSTED"}
_DEFAULT_PORTS = {"grpo.reward.v1": "50051", "grpo.rollout.v1": "50052", "grpo.trainer.v1": "50053"}

# Codes the shared runtime (grpo_runtime) can return on any RPC, whatever the service comments say.
RUNTIME_CODES = ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "CANCELLED", "INTERNAL")
ADMIN_CODES = ("UNAUTHENTICATED",)

_CODE_PATTERN = re.compile(r"\b(" + "|".join(sorted(RETRY_ADVICE, key=len, reverse=True)) + r")\b")
# `buf:lint:ignore` directives document lint exceptions for protobuf maintainers, not for API users.
_LINT_DIRECTIVE = re.compile(r"^\s*buf:lint:ignore\b.*$", re.MULTILINE)


def compile_descriptors(proto_root: Path) -> descriptor_pb2.FileDescriptorSet:
    """Compile every ``.proto`` under ``proto_root`` into a descriptor set that keeps comments."""
    protos = sorted(proto_root.rglob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {proto_root}")
    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "descriptors.pb"
        args = [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{well_known}",
            f"--descriptor_set_out={out}",
            "--include_source_info",
            *(str(p.relative_to(proto_root)) for p in protos),
        ]
        # Names relative to the proto root are protoc "virtual paths", resolved against the -I roots.
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


@dataclass
class Comments:
    """Leading comments of one file's elements, keyed by SourceCodeInfo path."""

    by_path: dict[tuple[int, ...], str]

    @classmethod
    def of(cls, file: descriptor_pb2.FileDescriptorProto) -> Comments:
        by_path = {}
        for location in file.source_code_info.location:
            text = _LINT_DIRECTIVE.sub("", location.leading_comments)
            lines = [line[1:] if line.startswith(" ") else line for line in text.splitlines()]
            cleaned = "\n".join(lines).strip()
            if cleaned:
                by_path[tuple(location.path)] = cleaned
        return cls(by_path)

    def get(self, *path: int) -> str:
        return self.by_path.get(tuple(path), "")


def _one_line(text: str) -> str:
    """A comment as one Markdown table cell: paragraphs joined, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _anchor(full_name: str) -> str:
    return full_name.lstrip(".").replace(".", "-").lower()


def _type_link(type_name: str) -> str:
    name = type_name.lstrip(".")
    if name.startswith("google.protobuf."):
        url = "https://protobuf.dev/reference/protobuf/google.protobuf/#" + name.rsplit(".", 1)[1].lower()
        return f"[`{name}`]({url})"
    return f"[`{name}`](#{_anchor(name)})"


def _is_admin(method: descriptor_pb2.MethodDescriptorProto) -> bool:
    return bool(method.options.Extensions[common_pb2.admin])


class Renderer:
    """Turns a descriptor set into the Markdown reference."""

    def __init__(self, descriptors: descriptor_pb2.FileDescriptorSet) -> None:
        self.files = sorted(
            (f for f in descriptors.file if f.package.startswith("grpo.")), key=lambda f: f.name
        )
        # Map entries are nested messages flagged map_entry; fields typed with them render as map<K, V>.
        self.map_entries: dict[str, descriptor_pb2.DescriptorProto] = {}
        for file in self.files:
            for message, full in _walk_messages(file.message_type, "." + file.package):
                if message.options.map_entry:
                    self.map_entries[full] = message

    def render(self) -> str:
        out: list[str] = [_HEADER]
        out += self._overview()
        out += [
            "",
            "## Status codes and retries",
            "",
            _STATUS_INTRO,
            "",
            "| Code | What to do |",
            "|---|---|",
        ]
        out += [f"| `{code}` | {advice} |" for code, advice in RETRY_ADVICE.items()]
        for file in self.files:
            out += self._file(file)
        return "\n".join(out).rstrip() + "\n"

    def _overview(self) -> list[str]:
        lines = [
            "",
            "## Services",
            "",
            "| Service | Package | Default port | RPCs | Admin RPCs |",
            "|---|---|---|---|---|",
        ]
        for file in self.files:
            for service in file.service:
                full = f"{file.package}.{service.name}"
                admin = [m.name for m in service.method if _is_admin(m)]
                port = _DEFAULT_PORTS.get(file.package, "same as its package's main service")
                lines.append(
                    f"| [`{full}`](#{_anchor(full)}) | `{file.package}` | {port} | {len(service.method)} | "
                    f"{', '.join(admin) or '—'} |"
                )
        return lines

    def _file(self, file: descriptor_pb2.FileDescriptorProto) -> list[str]:
        comments = Comments.of(file)
        out = ["", f"## Package `{file.package}`", "", f"Source: `protos/{file.name}`."]
        for index, service in enumerate(file.service):
            out += self._service(file, service, comments, (_FILE_SERVICE, index))
        messages = list(_walk_messages_with_paths(file.message_type, file.package, (_FILE_MESSAGE,)))
        if messages:
            out += ["", f"### Messages in `{file.package}`"]
        for message, full, path in messages:
            if message.options.map_entry:
                continue
            out += self._message(message, full, comments, path)
            for enum_index, enum in enumerate(message.enum_type):
                out += self._enum(enum, f"{full}.{enum.name}", comments, (*path, _MESSAGE_ENUM, enum_index))
        if file.enum_type:
            out += ["", f"### Enums in `{file.package}`"]
        for index, enum in enumerate(file.enum_type):
            out += self._enum(enum, f"{file.package}.{enum.name}", comments, (_FILE_ENUM, index))
        if file.extension:
            out += ["", f"### Options defined in `{file.package}`", ""]
            for ext in file.extension:
                out.append(
                    f"- `({file.package}.{ext.name})` on `{ext.extendee.lstrip('.')}` "
                    f"({_SCALAR_NAMES.get(ext.type, 'message')}, field {ext.number})."
                )
            for index, _ in enumerate(file.extension):
                text = comments.get(_FILE_EXTENSION, index)
                if text:
                    out += ["", text]
        return out

    def _service(self, file, service, comments: Comments, path: tuple[int, ...]) -> list[str]:
        full = f"{file.package}.{service.name}"
        text = comments.get(*path)
        out = ["", f'<a id="{_anchor(full)}"></a>', "", f"### Service `{full}`", ""]
        if text:
            out += [text, ""]
        out += ["| RPC | Request | Response | Admin | Description |", "|---|---|---|---|---|"]
        for index, method in enumerate(service.method):
            request = ("stream " if method.client_streaming else "") + _type_link(method.input_type)
            response = ("stream " if method.server_streaming else "") + _type_link(method.output_type)
            admin = "**yes**" if _is_admin(method) else "no"
            doc = _one_line(comments.get(*path, _SERVICE_METHOD, index)) or "—"
            out.append(f"| `{method.name}` | {request} | {response} | {admin} | {doc} |")
        out += ["", f"Full method names: `/{full}/<RPC>`.", ""]
        out += self._status_table(service, comments, path)
        return out

    def _status_table(self, service, comments: Comments, path: tuple[int, ...]) -> list[str]:
        """Codes named in the service's and its RPCs' comments, plus the runtime's and the admin check's."""
        texts = [comments.get(*path)]
        texts += [comments.get(*path, _SERVICE_METHOD, i) for i in range(len(service.method))]
        documented = {code for text in texts for code in _CODE_PATTERN.findall(text)} - {"OK"}
        codes = set(documented) | set(RUNTIME_CODES)
        if any(_is_admin(m) for m in service.method):
            codes |= set(ADMIN_CODES)
        ordered = [code for code in RETRY_ADVICE if code in codes]
        out = [
            f"Status codes a client of `{service.name}` can receive:",
            "",
            "| Code | Source | Retry? |",
            "|---|---|---|",
        ]
        for code in ordered:
            if code in documented:
                source = "this service (see the comments above)"
            elif code in ADMIN_CODES:
                source = "admin RPCs without a valid token"
            else:
                source = "runtime / transport"
            if code in _RETRYABLE:
                retry = "yes, with backoff"
            elif code in _WITH_PUSHBACK:
                retry = "only with `grpc-retry-pushback-ms`"
            else:
                retry = "conditional" if code in _CONDITIONAL else "no"
            out.append(f"| `{code}` | {source} | {retry} |")
        return out

    def _message(self, message, full: str, comments: Comments, path: tuple[int, ...]) -> list[str]:
        out = ["", f'<a id="{_anchor(full)}"></a>', "", f"#### `{full}`", ""]
        text = comments.get(*path)
        if text:
            out += [text, ""]
        if not message.field:
            return [*out, "No fields."]
        out += ["| Field | # | Type | Description |", "|---|---|---|---|"]
        for index, field in enumerate(message.field):
            doc = _one_line(comments.get(*path, _MESSAGE_FIELD, index)) or "—"
            out.append(f"| `{field.name}` | {field.number} | {self._field_type(field)} | {doc} |")
        return out

    def _field_type(self, field: descriptor_pb2.FieldDescriptorProto) -> str:
        if field.type_name in self.map_entries:
            key, value = self.map_entries[field.type_name].field
            key_name = _SCALAR_NAMES[key.type]
            if value.type in _SCALAR_NAMES:
                return f"`map<{key_name}, {_SCALAR_NAMES[value.type]}>`"
            return f"`map<{key_name},` {_type_link(value.type_name)}`>`"
        base = _SCALAR_NAMES.get(field.type) or _type_link(field.type_name)
        if base in _SCALAR_NAMES.values():
            base = f"`{base}`"
        if field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED:
            return f"repeated {base}"
        if field.proto3_optional:
            return f"optional {base}"
        return base

    def _enum(self, enum, full: str, comments: Comments, path: tuple[int, ...]) -> list[str]:
        out = ["", f'<a id="{_anchor(full)}"></a>', "", f"#### enum `{full}`", ""]
        text = comments.get(*path)
        if text:
            out += [text, ""]
        out += ["| Value | # | Description |", "|---|---|---|"]
        for index, value in enumerate(enum.value):
            doc = _one_line(comments.get(*path, _ENUM_VALUE, index)) or "—"
            out.append(f"| `{value.name}` | {value.number} | {doc} |")
        return out


def _walk_messages(messages, prefix: str):
    for message in messages:
        full = f"{prefix}.{message.name}"
        yield message, full
        yield from _walk_messages(message.nested_type, full)


def _walk_messages_with_paths(messages, prefix: str, path: tuple[int, ...]):
    for index, message in enumerate(messages):
        full = f"{prefix}.{message.name}"
        here = (*path, index)
        yield message, full, here
        yield from _walk_messages_with_paths(message.nested_type, full, (*here, _MESSAGE_NESTED))


_HEADER = """\
# gRPC API reference

<!-- Generated by scripts/gen_api_docs.py from protos/ — do not edit by hand.
     Regenerate: .venv/bin/python scripts/gen_api_docs.py   Check: ... --check (run by the tests). -->

Generated from the `.proto` files in `protos/grpo/` (the contract; packages follow the buf layout
directory = package). Every server also offers `grpc.health.v1.Health` (overall `""` and one entry per
service below) and server reflection, so tools such as
`grpcurl` can list and call the services without the `.proto` files (see [clients.md](clients.md)).

- **Admin RPCs** carry the method option `(grpo.common.v1.admin) = true`. When the server has an admin token
  (env `GRPO_ADMIN_TOKEN` or a token file), such calls need the metadata `authorization: Bearer <token>`
  or they fail with `UNAUTHENTICATED` before reaching the service. Public RPCs ignore the header.
- **Message size**: the default receive limit of gRPC is 4 MiB; the servers raise it with `server:
  max_message_bytes` in their config. Set the same limit on your channel for large weight updates or
  batches (`grpc.max_receive_message_length` / `grpc.max_send_message_length`).
- **Deadlines**: always set one. Score and Generate take as long as the work they are given."""

_STATUS_INTRO = """\
Errors are gRPC status codes with a human-readable message; validation errors name the offending field
(`rewards[1].name: unknown reward`). A problem with one sample of a Score request is not an RPC error: it
is reported in that sample's `ComponentScore.error`. Retry with exponential backoff and jitter, within the
caller's overall deadline, only where the table says so. `grpo_runtime.client.create_channel` does this for
`UNAVAILABLE` through the channel's retry policy: 5 attempts, 0.1 s first delay, doubling, at most 2 s."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto-root", type=Path, default=DEFAULT_PROTO_ROOT)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="exit 1 when --out differs from the protos")
    args = parser.parse_args(argv)
    text = Renderer(compile_descriptors(args.proto_root.resolve())).render()
    return write_or_check(
        args.out, text, check=args.check, command="python scripts/gen_api_docs.py", source="the protos"
    )


if __name__ == "__main__":
    sys.exit(main())
