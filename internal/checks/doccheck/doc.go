// Package doccheck holds the tests that keep the repository's Markdown honest: every Go block
// is a program that builds or is marked as a fragment, and the docs name what a user needs.
// It has no code of its own and imports nothing of ours.
package doccheck
