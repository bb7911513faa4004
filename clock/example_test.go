package clock_test

import (
	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit/clock"
)

func ExampleFake() {
	c := clock.NewFake(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	c.Advance(90 * time.Second)
	fmt.Println(c.Now().Format(time.TimeOnly))
	c.Set(time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)) // back in time: stores hold their latest instant
	fmt.Println(c.Now().Format(time.TimeOnly))
	// Output:
	// 12:01:30
	// 09:00:00
}
