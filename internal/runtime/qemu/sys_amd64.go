package qemu

const sysMemfdCreate = 319
