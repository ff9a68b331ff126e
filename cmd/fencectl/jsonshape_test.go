package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestJSONIsTheAPIs: -o json prints what the API answers for the same
// call, in protobuf's JSON mapping: lowerCamelCase names, the token a
// string of digits (a JSON number above 2^53 loses digits in most
// readers), durations as strings. get and list are compared with the
// API's own answers over HTTP/JSON, but for the time left, which moves,
// and grantedAt, which the Go client fencectl uses does not keep.
func TestJSONIsTheAPIs(t *testing.T) {
	t.Parallel()
	s := startFenced(t)

	r := s.want(t, 0, "acquire", "orders", "--holder", "a", "--ttl", "1m", "-o", "json")
	if !regexp.MustCompile(`^\{"lease":\{"scope":"orders","token":"[1-9][0-9]*","leaseId":"[0-9a-f]{32}","holder":"a","ttl":"60s","expiresIn":"[0-9.]+s","tokenText":"fence:v1:orders:[0-9]+"\}\}\n$`).MatchString(r.stdout) {
		t.Errorf("acquire -o json = %s; want the API's AcquireResponse", r.stdout)
	}
	for _, c := range []struct {
		args   []string
		method string
		body   string
	}{
		{[]string{"get", "orders"}, "fence.v1.LeaseService/Get", `{"scope":"orders"}`},
		{[]string{"get", "free"}, "fence.v1.LeaseService/Get", `{"scope":"free"}`},
		{[]string{"list"}, "fence.v1.LeaseService/List", `{}`},
		{[]string{"list", "none/"}, "fence.v1.LeaseService/List", `{"prefix":"none/"}`},
	} {
		got := jsonObject(t, s.want(t, 0, append(c.args, "-o", "json")...).stdout)
		want := jsonObject(t, apiCall(t, s.addr, c.method, c.body))
		if !reflect.DeepEqual(withoutMoving(got), withoutMoving(want)) {
			t.Errorf("fencectl %s -o json:\n%v\nthe API's %s:\n%v", strings.Join(c.args, " "), got, c.method, want)
		}
	}
	r = s.want(t, 0, "cluster", "status", "-o", "json")
	got, want := jsonObject(t, r.stdout), jsonObject(t, apiCall(t, s.addr, "fence.v1.ClusterService/Status", `{}`))
	for _, m := range []map[string]any{got, want} {
		delete(m, "commitIndex") // they move on
		delete(m, "appliedIndex")
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("fencectl cluster status -o json:\n%v\nthe API's:\n%v", got, want)
	}
}

// withoutMoving drops what two reads of the same lease may disagree on:
// the time left, and grantedAt.
func withoutMoving(m map[string]any) map[string]any {
	drop := func(l any) {
		if l, ok := l.(map[string]any); ok {
			delete(l, "expiresIn")
			delete(l, "grantedAt")
		}
	}
	drop(m["lease"])
	if ls, ok := m["leases"].([]any); ok {
		for _, l := range ls {
			drop(l)
		}
	}
	return m
}

func jsonObject(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return m
}

// apiCall calls the API's method with a JSON body over plain HTTP, as
// docs/protocol.md shows with curl.
func apiCall(t *testing.T, addr, method, body string) string {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Post("http://"+addr+"/"+method, "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s %s, %v", method, resp.Status, b, err)
	}
	return string(b)
}
