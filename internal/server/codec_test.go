package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/fencetest"
)

// TestJSONErrorsNameTheField posts Connect JSON by hand with a value of
// the wrong kind: the answer names the field, by its proto name however
// the request spelled it, and says what the field takes, and keeps what
// protojson found. JSON that is wrong as a whole, not in one field, gets
// protojson's own error.
func TestJSONErrorsNameTheField(t *testing.T) {
	const duration = `invalid ttl: want a duration in seconds as a string, such as "15s" or "0.5s"`
	acquire := rpc{path: fencev1connect.LeaseServiceAcquireProcedure}
	watch := rpc{path: fencev1connect.LeaseServiceWatchProcedure, streaming: true}
	srv := fencetest.NewServer()
	t.Cleanup(srv.Close)
	raw := newRawClient(t, srv.Addr)
	for _, tc := range []struct {
		name string
		m    rpc
		body string
		says []string
	}{
		{"TTL as a number", acquire, `{"scope":"x","ttl":15}`, []string{duration, "unexpected token 15"}},
		{"TTL without a unit", acquire, `{"scope":"x","ttl":"15"}`, []string{duration, `invalid google.protobuf.Duration value "15"`}},
		{"TTL in minutes", acquire, `{"scope":"x","ttl":"1m"}`, []string{duration}},
		{"wait as a string", acquire, `{"scope":"x","wait":"yes"}`, []string{"invalid wait: want true or false"}},
		{"request ID as a number, camel case", acquire, `{"scope":"x","requestId":5}`, []string{"invalid request_id: want a string"}},
		{"a field after an unknown one", acquire, `{"newer":{"a":[1]},"scope":7}`, []string{"invalid scope: want a string"}},
		{"watch, include_held as a number", watch, `{"include_held":1}`, []string{"invalid include_held: want true or false"}},
		{"duplicate field", acquire, `{"scope":"x","scope":"y"}`, []string{`duplicate field "scope"`}},
		{"an array", acquire, `[1]`, []string{"unexpected token ["}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := raw.post(t, tc.m, false, []byte(tc.body))
			if a.code != "invalid_argument" {
				t.Fatalf("answered %q (%s), want invalid_argument", a.code, a.msg)
			}
			for _, s := range tc.says {
				if !strings.Contains(a.msg, s) {
					t.Errorf("%q does not say %q", a.msg, s)
				}
			}
		})
	}
}

// TestJSONCharsetCodec: a client that names the charset gets the same
// codec, errors and answers.
func TestJSONCharsetCodec(t *testing.T) {
	srv := fencetest.NewServer()
	t.Cleanup(srv.Close)
	post := func(body string) (int, string) {
		t.Helper()
		resp, err := http.Post("http://"+srv.Addr+fencev1connect.LeaseServiceAcquireProcedure, "application/json; charset=utf-8", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	if code, b := post(`{"scope":"x","ttl":15}`); code != http.StatusBadRequest || !strings.Contains(b, "invalid ttl: want a duration") {
		t.Errorf("HTTP %d %s, want 400 naming ttl", code, b)
	}
	code, b := post(`{"scope":"x","ttl":"15s"}`)
	var ok struct {
		Lease struct {
			Scope string `json:"scope"`
			TTL   string `json:"ttl"`
		} `json:"lease"`
	}
	if err := json.Unmarshal([]byte(b), &ok); code != http.StatusOK || err != nil || ok.Lease.Scope != "x" || ok.Lease.TTL != "15s" {
		t.Errorf("HTTP %d %s (%v), want the grant of x for 15s", code, b, err)
	}
}
