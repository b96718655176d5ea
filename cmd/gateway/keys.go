package main

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
)

// keyPrefix starts every generated key, so a leaked one is recognisable
// (secret scanners match on such prefixes).
const keyPrefix = "sk-sb-"

// maxKeyInput caps the key read from stdin, in bytes.
const maxKeyInput = 4096

// keysCommand runs `switchboard keys hash [--generate]`: it prints the hex
// SHA-256 of the key read from stdin (its first line, the line ending
// dropped), the value of auth.keys[].sha256; with --generate it makes a
// random key instead and prints "key: ..." and "sha256: ...".
func keysCommand(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "hash" {
		return errors.New("usage: switchboard keys hash [--generate] (the key on stdin)")
	}
	fs := pflag.NewFlagSet("switchboard keys hash", pflag.ContinueOnError)
	gen := fs.Bool("generate", false, "generate a random key; print it and its hash")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		// A key on the command line would land in the shell history and
		// the process list.
		return errors.New("keys hash takes the key on stdin, not as an argument")
	}
	if *gen {
		var b [32]byte
		_, _ = rand.Read(b[:])
		key := keyPrefix + base64.RawURLEncoding.EncodeToString(b[:])
		_, err := fmt.Fprintf(stdout, "key: %s\nsha256: %s\n", key, hashKey(key))
		return err
	}
	line, err := bufio.NewReader(io.LimitReader(stdin, maxKeyInput)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read the key from stdin: %w", err)
	}
	key := strings.TrimRight(line, "\r\n")
	if key == "" {
		return errors.New("no key on stdin")
	}
	_, err = fmt.Fprintln(stdout, hashKey(key))
	return err
}

// hashKey is the hex SHA-256 of key, as the gateway compares it.
func hashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}
