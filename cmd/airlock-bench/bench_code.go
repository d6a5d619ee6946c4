package main

import (
	"fmt"
	"os"
	"time"
)

// codeLangs are the code contexts' languages, with a program that prints
// 42 in each.
var codeLangs = []struct{ lang, code string }{
	{"python", "print(6*7)"},
	{"javascript", "console.log(6*7)"},
	{"bash", "echo $((6*7))"},
}

// codeBench times the first `airlock code` call of each language in a new
// sandbox of rtName (the context's interpreter starts) and the second one
// (it is warm), median of runs fresh sandboxes each.
func codeBench(c airlockCLI, rtName string, runs int) ([][3]string, error) {
	var rows [][3]string
	for _, l := range codeLangs {
		var first, second []time.Duration
		for range runs {
			id, err := c.run("--runtime", rtName, "create")
			if err != nil {
				return nil, err
			}
			var ds [2]time.Duration
			for i := range ds {
				t := time.Now()
				out, err := c.run("code", "--lang", l.lang, id, l.code)
				ds[i] = time.Since(t)
				if err == nil && out != "42" {
					err = fmt.Errorf("printed %q, not 42", out)
				}
				if err != nil {
					_, _ = c.run("rm", id)
					return nil, fmt.Errorf("%s code, %s: %w", rtName, l.lang, err)
				}
			}
			if _, err := c.run("rm", id); err != nil {
				return nil, err
			}
			first, second = append(first, ds[0]), append(second, ds[1])
			fmt.Fprintf(os.Stderr, "bench: %s %s code: first %s, then %s\n", rtName, l.lang, ms(ds[0]), ms(ds[1]))
		}
		rows = append(rows, [3]string{
			fmt.Sprintf("first `code` call in a new sandbox (%s context), %s", l.lang, rtName),
			ms(median(first)),
			fmt.Sprintf("median of %d fresh sandboxes, through the CLI; the second call %s", runs, ms(median(second))),
		})
	}
	return rows, nil
}
