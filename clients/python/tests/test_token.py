"""The protocol's test vectors (testdata/protocol/vectors.json), read from
the repository: parsing, the comparison rule and signatures."""

import base64
import http.server
import os
import subprocess
import sys
import threading
import unittest

from support import needs_cryptography, SRC, vectors

import fence
from fence import InvalidError, KeySet, RemoteKeySet, Token, check, format_token, parse_token, signed_payload

V = vectors()


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class TestVectors(unittest.TestCase):
    def test_valid_texts_parse_and_round_trip(self):
        self.assertTrue(V["parse"]["valid"])
        for c in V["parse"]["valid"]:
            with self.subTest(c["text"]):
                t = parse_token(c["text"])
                self.assertEqual(t.scope, c["scope"])
                self.assertEqual(t.value, int(c["value"]))
                self.assertEqual(f"fence:v{t.version}:", c["text"][:9])
                if "signature" in c:
                    self.assertEqual(t.key_id, c["key_id"])
                    self.assertEqual(b64url(t.signature), c["signature"])
                    self.assertEqual(t.lease_id, c.get("lease_id"))
                    if "payload_hex" in c:
                        self.assertEqual(signed_payload(t).hex(), c["payload_hex"])
                else:
                    self.assertIsNone(t.signature)
                self.assertEqual(format_token(t), c["text"], "the text form must round-trip")
                self.assertEqual(str(t), c["text"])

    def test_invalid_texts_are_refused(self):
        self.assertTrue(V["parse"]["invalid"])
        for c in V["parse"]["invalid"]:
            with self.subTest(c["text"][:70], why=c["why"]):
                with self.assertRaises(InvalidError):
                    parse_token(c["text"])

    def test_compare_plain_and_strict(self):
        self.assertTrue(V["compare"])
        for c in V["compare"]:
            p, h = int(c["presented"]), int(c["highest"])
            ps, hs = int(c.get("presented_sequence", 0)), int(c.get("highest_sequence", 0))
            strict = c.get("accepted_strict", c["accepted"])
            with self.subTest(f"{p}.{ps} over {h}.{hs}", why=c["why"]):
                self.assertEqual(check("s", h, hs, p, ps) is None, c["accepted"])
                self.assertEqual(check("s", h, hs, p, ps, strict=True) is None, strict)

    @needs_cryptography
    def test_verify_against_the_key_set(self):
        keys = KeySet(V["keys"])
        self.assertTrue(V["verify"])
        for c in V["verify"]:
            with self.subTest(c["text"][:70], why=c.get("why")):
                try:
                    keys.verify(parse_token(c["text"]))
                    ok = True
                except InvalidError:
                    ok = False
                self.assertEqual(ok, c["valid"])

    @needs_cryptography
    def test_seeds_sign_the_valid_tokens_again(self):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        n = 0
        for k in V["keys"]["keys"]:
            priv = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(V["seeds"][k["kid"]]))
            for c in V["parse"]["valid"] + [c for c in V["verify"] if c["valid"]]:
                t = parse_token(c["text"])
                if t.key_id != k["kid"]:
                    continue
                self.assertEqual(priv.sign(signed_payload(t)), t.signature, c["text"])
                n += 1
        self.assertGreater(n, 0)

    @needs_cryptography
    def test_v3_forgeries(self):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        k = next(k for k in V["keys"]["keys"] if "not_after" not in k)
        priv = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(V["seeds"][k["kid"]]))
        keys = KeySet(V["keys"])
        unsigned = Token(3, "orders/shard-7", 9007199254740993, k["kid"], bytes(64))
        self.assertEqual(signed_payload(unsigned), b"fence-token-v3\x00orders/shard-7\x009007199254740993")
        t = Token(3, unsigned.scope, unsigned.value, k["kid"], priv.sign(signed_payload(unsigned)))
        text = format_token(t)
        self.assertRegex(text, r"^fence:v3:orders/shard-7:9007199254740993:k1700000000-a1b2c3:[A-Za-z0-9_-]{86}$")
        self.assertEqual(parse_token(text), t)
        keys.verify(parse_token(text))
        sig = text.rsplit(":", 1)[1]
        for forged in (
            f"fence:v3:orders/shard-7:9007199254740992:{k['kid']}:{sig}",
            f"fence:v3:orders/shard-8:9007199254740993:{k['kid']}:{sig}",
            f"fence:v3:orders/shard-7:{fence.MAX_TOKEN}:{k['kid']}:{sig}",
        ):
            with self.assertRaises(InvalidError, msg=forged):
                keys.verify(parse_token(forged))
        with self.assertRaises(InvalidError):
            parse_token(f"fence:v3:orders:42:{k['kid']}")
        with self.assertRaises(InvalidError):
            keys.verify(parse_token("fence:v1:orders:42"))  # unsigned, where signed ones are required

    def test_values_beyond_2_53_stay_exact(self):
        a = parse_token("fence:v1:s:9007199254740993")
        b = parse_token("fence:v1:s:9007199254740992")
        self.assertIsNotNone(check("s", a.value, 0, b.value), "2^53 after 2^53+1 must be stale")
        self.assertEqual(parse_token(f"fence:v1:s:{fence.MAX_TOKEN}").value, (1 << 63) - 1)

    def test_scope_errors_name_the_field(self):
        with self.assertRaises(InvalidError) as cm:
            parse_token("fence:v1:orders/../x:1")
        self.assertEqual(cm.exception.field, "scope")


class TestRemoteKeySet(unittest.TestCase):
    @needs_cryptography
    def test_unknown_key_id_fetches_at_most_once_per_interval(self):
        import json

        hits = []

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path)
                body = json.dumps(V["keys"]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{srv.server_address[1]}"
            genuine = parse_token(next(c for c in V["verify"] if c["valid"])["text"])
            unknown = parse_token(next(c for c in V["verify"] if "unknown key" in c.get("why", ""))["text"])
            keys = RemoteKeySet(url, refresh_interval=3600)
            keys.verify(genuine)
            for _ in range(5):
                with self.assertRaises(InvalidError):
                    keys.verify(unknown)
            self.assertEqual(hits, ["/keys"], "one fetch, however many unknown key IDs")
            eager = RemoteKeySet(url, refresh_interval=0)
            eager.verify(genuine)
            with self.assertRaises(InvalidError):
                eager.verify(unknown)
            self.assertEqual(len(hits), 3, "with no interval, an unknown key ID fetches again")
        finally:
            srv.shutdown()
            srv.server_close()


class TestWithoutCryptography(unittest.TestCase):
    def test_a_clear_error_and_everything_else_works(self):
        # A Python where cryptography cannot be imported: a child process
        # whose import of it fails, as on a machine without the package.
        code = r"""
import sys
sys.modules["cryptography"] = None  # import cryptography raises ImportError
import fence
assert not fence.have_cryptography()
t = fence.parse_token(sys.argv[1])
assert t.value == 42 and t.signed
try:
    fence.KeySet({"keys": []})
except fence.MissingCryptographyError as err:
    assert isinstance(err, ImportError) and isinstance(err, fence.FenceError)
    print(err)
else:
    raise SystemExit("KeySet without cryptography did not raise")
try:
    fence.RemoteKeySet("http://127.0.0.1:9")
except fence.MissingCryptographyError:
    pass
else:
    raise SystemExit("RemoteKeySet without cryptography did not raise")
"""
        text = next(c for c in V["parse"]["valid"] if c["text"].startswith("fence:v3:"))["text"]
        r = subprocess.run(
            [sys.executable, "-c", code, text], capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": SRC},
        )
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("needs the cryptography package", r.stdout)
        self.assertIn("apt-get install python3-cryptography", r.stdout)
        self.assertIn("pip install cryptography", r.stdout)


if __name__ == "__main__":
    unittest.main()
