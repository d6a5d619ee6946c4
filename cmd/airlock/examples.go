package main

import (
	"strings"

	"github.com/spf13/cobra"
)

// examples are the Example sections of --help, by command path below
// "airlock". They live in one place so that TestEveryCommandHasExamples can
// hold every visible command to having some; a command that sets its own
// Example keeps it.
var examples = map[string]string{
	"run": `  airlock run -- python3 -c 'print(6*7)'
  airlock run --net deny --allow pypi.org --allow files.pythonhosted.org -- pip install requests
  echo 'print("hi")' | airlock run -i -- python3 -
  airlock run -t -- top                      # a terminal, of this terminal's size
  airlock run -v data:/data -- python3 train.py   # volume data, read-write
  airlock run -v data:/data:ro -- ls -l /data     # read-only (any number of sandboxes)
  airlock run --runtime gvisor --mount ./src:/src -- ls /src   # a host directory, read-only`,
	"create": `  id=$(airlock create)
  airlock create --memory 2G --cpus 2 --lifetime 2h --idle-pause 10m
  airlock create --image myimage --net deny --allow api.example.com:443 -p 8080:8000
  airlock create --from-snapshot with-deps
  airlock create -v data:/data -v models:/models:ro
  airlock create --runtime gvisor --mount /srv/datasets:/datasets --mount ./out:/out:rw`,
	"exec": `  airlock exec $id -- ls -la /
  airlock exec -it $id -- bash               # an interactive terminal
  airlock exec -u user -w /tmp -e DEBUG=1 $id -- env
  airlock exec --timeout 30s $id -- make test`,
	"shell": `  airlock shell $id`,
	"cp": `  airlock cp ./script.py $id:/root/script.py
  airlock cp $id:/root/out.csv ./out.csv
  airlock cp -r ./project $id:/srv             # /srv/project (or /srv itself if it did not exist)
  airlock cp -r ./project/. $id:/srv/app       # project's contents into /srv/app
  airlock cp -r $id:/srv/app/results ./results
  airlock cp -r $id:/srv/app - | tar -tv       # a tar stream to stdout`,
	"ls": `  airlock ls
  airlock ls --size
  airlock ls --json | jq -r '.[].id'`,
	"inspect": `  airlock inspect $id | jq .state`,
	"logs":    `  airlock logs $id`,
	"rm": `  airlock rm $id
  airlock rm $(airlock ls --json | jq -r '.[].id')   # every sandbox`,
	"pause": `  airlock pause $id
  airlock pause --force $id                  # even with commands running (they are ended)`,
	"resume": `  airlock resume $id                         # any other call on it resumes it too`,
	"touch":  `  airlock touch $id                          # counts as activity for --idle-pause`,
	"snapshot": `  airlock snapshot $id --name with-deps
  airlock create --from-snapshot with-deps
  airlock snapshot ls`,
	"snapshot create": `  airlock snapshot create $id --name with-deps`,
	"snapshot ls": `  airlock snapshot ls
  airlock snapshot ls --json`,
	"snapshot rm":    `  airlock snapshot rm with-deps`,
	"snapshot prune": `  airlock snapshot prune`,
	"network": `  airlock network get $id
  airlock network set $id --allow pypi.org --allow files.pythonhosted.org   # deny all but these
  airlock network set $id --net public                  # back to the public internet`,
	"network get": `  airlock network get $id
  airlock network get --json $id | jq .allow`,
	"network set": `  airlock network set $id --net deny                    # cut off all egress now
  airlock network set $id --allow api.example.com:443  # only this (every other rule is removed)
  airlock network set --json $id --net public`,
	"network add-secret": `  airlock network add-secret $id vault:GITHUB_TOKEN          # from the vault, to its hosts
  GITHUB_TOKEN=ghp-... airlock network add-secret $id GITHUB_TOKEN@api.github.com`,
	"network rm-secret": `  airlock network rm-secret $id GITHUB_TOKEN`,
	"secret": `  airlock secret set GITHUB_TOKEN --hosts api.github.com     # the value from $GITHUB_TOKEN
  airlock run --secret vault:GITHUB_TOKEN -- sh -c 'curl -H "Authorization: Bearer $GITHUB_TOKEN" https://api.github.com/user'
  airlock secret ls`,
	"secret set": `  airlock secret set GITHUB_TOKEN --hosts api.github.com     # the value from $GITHUB_TOKEN
  pass show github | airlock secret set GITHUB_TOKEN --stdin`,
	"secret ls": `  airlock secret ls
  airlock secret ls --json | jq -r '.[].name'`,
	"secret rm": `  airlock secret rm GITHUB_TOKEN`,
	"volume": `  airlock volume create data --size 10G
  airlock run -v data:/data -- sh -c 'echo hi > /data/greeting'
  airlock run -v data:/data:ro -- cat /data/greeting
  airlock volume ls`,
	"volume create": `  airlock volume create data --size 10G`,
	"volume ls": `  airlock volume ls
  airlock volume ls --json | jq -r '.[].name'`,
	"volume inspect": `  airlock volume inspect data
  airlock volume inspect data --json | jq .attachments`,
	"volume resize": `  airlock volume resize data --size 20G`,
	"volume rm": `  airlock volume rm data
  airlock volume rm data models`,
	"fork": `  airlock fork $id                           # one running copy
  airlock fork $id --count 3`,
	"image": `  airlock image ls
  airlock image pull docker.io/library/python:3.12-slim --name py312
  airlock run --image py312 -- python3 --version`,
	"image build": `  airlock image build base
  airlock image build browser                # Chromium for 'airlock browser'`,
	"browser": `  airlock image build browser
  id=$(airlock create --image browser)
  airlock browser cdp $id
  airlock browser screenshot $id https://example.com -o page.png`,
	"browser start": `  airlock browser start $id
  airlock browser start $id --interactive --signed-ttl 30m --json`,
	"browser status": `  airlock browser status $id`,
	"browser cdp": `  airlock browser cdp $id                     # prints ws:// and http:// URLs
  airlock browser cdp $id --listen 127.0.0.1:9222`,
	"browser view": `  airlock browser view $id                    # open the printed URL
  airlock browser view $id --interactive`,
	"browser screenshot": `  airlock browser screenshot $id https://example.com -o page.png
  airlock browser screenshot $id http://localhost:8000/ -o app.png --full-page`,
	"image import": `  docker save myimage:latest -o myimage.tar && airlock image import myimage.tar --name myimage`,
	"image pull":   `  airlock image pull docker.io/library/alpine:3.20 --name alpine`,
	"image rm":     `  airlock image rm alpine`,
	"image prune":  `  airlock image prune`,
	"image ls": `  airlock image ls
  airlock image ls --json`,
	"setup":  `  airlock setup`,
	"doctor": `  airlock doctor`,
	"serve": `  airlock serve --listen 127.0.0.1:7070
  AIRLOCK_HOST=http://127.0.0.1:7070 AIRLOCK_API_KEY=$key airlock run -- echo remote`,
	"node": `  openssl rand -hex 32 > /etc/airlock/node-token && chmod 600 /etc/airlock/node-token
  kubectl apply -k deploy/kubernetes
  airlock node --name node1 --listen 10.0.0.5:7443 --tls-cert node.crt --tls-key node.key --node-token-file /etc/airlock/node-token --kubeconfig node.kubeconfig`,
	"keys": `  airlock keys create --tenant acme --max-sandboxes 20
  airlock keys ls`,
	"keys create": `  airlock keys create --tenant acme
  airlock keys create --tenant ops --admin
  airlock keys create --tenant acme --max-memory-mb 8192 --max-vcpus 8 --rate-per-min 600`,
	"keys ls": `  airlock keys ls
  airlock keys ls --json`,
	"keys update": `  airlock keys update 3f9a0c1b2d --net-conn-rate 20 --net-dests-per-min 100   # an ID from keys ls
  airlock keys update 3f9a0c1b2d --net-udp-pps -1                        # no UDP packet rate limit`,
	"keys revoke": `  airlock keys revoke c5ypv5pl                # an ID from keys ls`,
	"events": `  airlock events $id
  airlock events --type net.deny --limit 50`,
	"events retention": `  airlock events retention
  airlock events retention --max-age 90d --max-size 1G --prune`,
	"mcp": `  airlock mcp`,
	"code": `  airlock code $id 'x = 6*7'
  airlock code $id 'print(x)'                # state is kept
  airlock code --lang javascript $id 'console.log(1+1)'
  airlock code --out plots $id -f plot.py    # save figures`,
	"contexts": `  airlock contexts create $id --lang python --id analysis
  airlock code --context analysis $id 'import pandas'
  airlock contexts ls $id`,
	"contexts create":    `  airlock contexts create $id --lang bash --cwd /tmp --id sh1`,
	"contexts ls":        `  airlock contexts ls $id --json`,
	"contexts rm":        `  airlock contexts rm $id analysis`,
	"contexts restart":   `  airlock contexts restart $id analysis`,
	"contexts interrupt": `  airlock contexts interrupt $id analysis`,
	"version":            `  airlock version`,
	"completion": `  source <(airlock completion bash)
  airlock completion zsh > "${fpath[1]}/_airlock"`,
	"completion bash":       `  airlock completion bash > /etc/bash_completion.d/airlock`,
	"completion zsh":        `  airlock completion zsh > "${fpath[1]}/_airlock"`,
	"completion fish":       `  airlock completion fish > ~/.config/fish/completions/airlock.fish`,
	"completion powershell": `  airlock completion powershell | Out-String | Invoke-Expression`,
}

// addExamples sets the Example of every command below root that has none
// and is listed in examples.
func addExamples(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Example == "" {
			c.Example = examples[strings.TrimPrefix(c.CommandPath(), root.Name()+" ")]
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
