package signing_test

import (
	"encoding/json"
	"time"

	"github.com/fence-dev/fence/signing"
)

func jsonFile(keys ...signing.PublicKey) ([]byte, error) {
	return json.Marshal(signing.File{Keys: keys})
}

func testNow() time.Time { return time.Now() }
