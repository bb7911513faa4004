package redisstore_test

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit/redisstore"
)

// TestNewRejectsNil: a nil client or option panics at New with a message, not at the
// first decision with a nil dereference.
func TestNewRejectsNil(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer client.Close()
	for name, f := range map[string]func(){
		"nil client":        func() { redisstore.New(nil) },
		"nil *redis.Client": func() { redisstore.New((*redis.Client)(nil)) },
		"nil option":        func() { redisstore.New(client, nil) },
	} {
		func() {
			defer func() {
				msg, _ := recover().(string)
				if !strings.HasPrefix(msg, "redisstore: New") {
					t.Errorf("%s: recovered %q; want a panic that says what is wrong", name, msg)
				}
			}()
			f()
		}()
	}
}
