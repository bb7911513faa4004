package redisstore

// MaxFlights is how many calls to one node may be in flight at once on a client whose
// pool holds at most 2*MaxFlights connections (or to a server that answers within
// flightStep), for the tests that hold every flight.
const MaxFlights = maxFlights
