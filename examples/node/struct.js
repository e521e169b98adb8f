// google.protobuf.Struct / Value as @grpc/proto-loader represents them, to and from plain JSON values.
'use strict';

/** A JSON value as a google.protobuf.Value message (as proto-loader expects it). */
function toValue(value) {
  if (value === null || value === undefined) return { nullValue: 'NULL_VALUE' };
  if (typeof value === 'number') return { numberValue: value };
  if (typeof value === 'string') return { stringValue: value };
  if (typeof value === 'boolean') return { boolValue: value };
  if (Array.isArray(value)) return { listValue: { values: value.map(toValue) } };
  return { structValue: toStruct(value) };
}

/** A JSON object as a google.protobuf.Struct message. */
function toStruct(object) {
  const fields = {};
  for (const [key, value] of Object.entries(object || {})) fields[key] = toValue(value);
  return { fields };
}

/** A decoded google.protobuf.Value back to plain JSON. */
function fromValue(value) {
  if (!value) return null;
  switch (value.kind) {
    case 'numberValue':
      return value.numberValue;
    case 'stringValue':
      return value.stringValue;
    case 'boolValue':
      return value.boolValue;
    case 'listValue':
      return (value.listValue.values || []).map(fromValue);
    case 'structValue':
      return fromStruct(value.structValue);
    default:
      return null;
  }
}

/** A decoded google.protobuf.Struct back to a plain object ({} when unset). */
function fromStruct(struct) {
  return Object.fromEntries(Object.entries((struct && struct.fields) || {}).map(([k, v]) => [k, fromValue(v)]));
}

module.exports = { toValue, toStruct, fromValue, fromStruct };
