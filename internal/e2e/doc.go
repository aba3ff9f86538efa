// Package e2e holds the end-to-end tests: whole agentq processes (agentq.New and
// Start, with the roles a test names) on each test's own Postgres schema and Redis key
// prefix, driven over HTTP, through the client package and through the library, and
// checked against what they left in Postgres and Redis. The tests with the build tag
// cluster (`make test-cluster`) run the roles as separate processes on a local Redis
// Cluster. Every answer of an agentq process the tests call is checked against the
// OpenAPI document it serves (contract_test.go). There is no code here besides the
// tests.
package e2e
