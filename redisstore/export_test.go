package redisstore

// MaxFlights is how many calls to one node may be in flight at once, for the tests that
// hold every flight.
const MaxFlights = maxFlights
