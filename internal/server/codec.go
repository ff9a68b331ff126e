package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/fence-dev/fence"
)

// jsonCodecs replaces connect-go's JSON codecs, under both names a client
// may ask for, with jsonCodec.
func jsonCodecs() connect.Option {
	return connect.WithOptions(
		connect.WithCodec(jsonCodec{"json"}),
		connect.WithCodec(jsonCodec{"json; charset=utf-8"}),
	)
}

// jsonCodec is connect-go's protojson codec with errors that name the
// field: protojson's own say where in the text it stopped ("syntax error
// (line 1:20): unexpected token 15" for "ttl": 15), not which field it was
// reading nor what that field takes, and a person writing JSON by hand
// needs both. It is safe for concurrent use.
type jsonCodec struct{ name string }

func (c jsonCodec) Name() string { return c.name }

func (jsonCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", v)
	}
	return protojson.Marshal(m)
}

func (jsonCodec) MarshalAppend(dst []byte, v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", v)
	}
	return protojson.MarshalOptions{}.MarshalAppend(dst, m)
}

func (jsonCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a protobuf message", v)
	}
	if len(data) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	// Like connect-go's: a newer client's fields are ignored.
	err := unmarshalJSON(data, m)
	if err == nil {
		return nil
	}
	if ferr := fieldError(m.ProtoReflect(), data, ""); ferr != nil {
		return ferr
	}
	return err
}

func unmarshalJSON(data []byte, m proto.Message) error {
	return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(data, m)
}

// fieldError finds the first field of the JSON object data that m's type
// refuses on its own, and returns a *fence.InvalidError naming it (with
// prefix, for a field of a nested message) and saying what it takes. It
// returns nil if data is not a JSON object or every field passes alone:
// then the fault is elsewhere (such as a duplicate field), and protojson's
// error says it best.
func fieldError(m protoreflect.Message, data []byte, prefix string) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	fields := m.Descriptor().Fields()
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil
		}
		name, _ := t.(string)
		fd := fields.ByJSONName(name)
		if fd == nil {
			fd = fields.ByTextName(name)
		}
		if fd == nil {
			continue // unknown, ignored
		}
		one, err := json.Marshal(map[string]json.RawMessage{name: raw})
		if err != nil {
			return nil
		}
		err = unmarshalJSON(one, m.New().Interface())
		if err == nil {
			continue
		}
		field := prefix + string(fd.Name())
		if fd.Kind() == protoreflect.MessageKind && !fd.IsList() && !fd.IsMap() && !wellKnown(fd.Message()) {
			if ferr := fieldError(m.New().NewField(fd).Message(), raw, field+"."); ferr != nil {
				return ferr
			}
		}
		return &fence.InvalidError{Field: field, Reason: "want " + allowed(fd) + " (" + protojsonReason(err) + ")"}
	}
	return nil
}

// protojsonPosition is the start of protojson's error text: where in the
// JSON it stopped, which says nothing once the field is named.
var protojsonPosition = regexp.MustCompile(`^proto:\s*(syntax error\s*)?(\(line \d+:\d+\):\s*)?`)

func protojsonReason(err error) string {
	return protojsonPosition.ReplaceAllString(err.Error(), "")
}

func wellKnown(md protoreflect.MessageDescriptor) bool {
	return md.FullName().Parent() == "google.protobuf"
}

// allowed says what JSON value fd takes, in protojson's mapping.
func allowed(fd protoreflect.FieldDescriptor) string {
	switch {
	case fd.IsMap():
		return "an object"
	case fd.IsList():
		return "an array, each element " + allowedValue(fd)
	}
	return allowedValue(fd)
}

func allowedValue(fd protoreflect.FieldDescriptor) string {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return "true or false"
	case protoreflect.StringKind:
		return "a string"
	case protoreflect.BytesKind:
		return "a base64 string"
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return "a number"
	case protoreflect.EnumKind:
		values := fd.Enum().Values()
		names := make([]string, values.Len())
		for i := range names {
			names[i] = fmt.Sprintf("%q", values.Get(i).Name())
		}
		return "one of " + strings.Join(names, ", ") + " or its number"
	case protoreflect.MessageKind, protoreflect.GroupKind:
		switch fd.Message().FullName() {
		case "google.protobuf.Duration":
			return `a duration in seconds as a string, such as "15s" or "0.5s"`
		case "google.protobuf.Timestamp":
			return `an RFC 3339 time string such as "2026-01-02T15:04:05Z"`
		}
		return "an object"
	}
	return "an integer"
}
