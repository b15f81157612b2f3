// Command toolfence is the one binary of toolfence: the demo story, and ls, show, resolve and
// gc over a ledger store (a badger directory or a PostgreSQL DSN); serve, migrate and eval
// register themselves from their own files (see register in root.go).
package main
