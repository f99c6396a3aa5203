'use strict';
// s3rver for benchmarks/objectstore.py: `node serve.js PORT DIRECTORY BUCKET`.
//
// s3rver keeps objects as plain files and streams ranged GETs from them, so unlike moto a
// range costs what it transfers. Three things are made to behave as on S3: If-Match on GET and
// HEAD (412 when the ETag differs), so pinned ranged loads fail on a replaced object,
// CompleteMultipartUpload, which S3 finishes without re-reading the whole object, and
// PutObject, which S3 commits whole or not at all.
const S3rver = require('s3rver');

const [port, directory, bucket] = process.argv.slice(2);

const server = new S3rver({
  address: '127.0.0.1',
  port: Number(port),
  directory,
  silent: true,
  allowMismatchedSignatures: true,
  configureBuckets: [{ name: bucket }],
});

function unquote(tag) {
  return String(tag).replace(/"/g, '').trim();
}

server.middleware.unshift(async (ctx, next) => {
  const wanted = ctx.headers['if-match'];
  if (!wanted || (ctx.method !== 'GET' && ctx.method !== 'HEAD')) return next();
  const [, name, ...rest] = ctx.path.split('/');
  if (!name || rest.length === 0) return next();
  const key = decodeURIComponent(rest.join('/'));
  let metadata;
  try {
    metadata = await server.store.getMetadata(name, key);
  } catch (err) {
    return next(); // no such object: s3rver answers NoSuchKey itself
  }
  const tags = wanted.split(',').map(unquote);
  if (tags.includes('*') || tags.includes(unquote(metadata.etag))) return next();
  ctx.status = 412;
  ctx.type = 'application/xml';
  ctx.body =
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>PreconditionFailed</Code>' +
    '<Message>At least one of the pre-conditions you specified did not hold</Message>' +
    '<Condition>If-Match</Condition></Error>';
  return undefined;
});

// CompleteMultipartUpload as S3 does it: without reading, hashing or copying the object.
// s3rver's own streams every part through an MD5 of the whole object into a new file; joining
// 256 MiB costs 0.4-1 s on this VM even on tmpfs (allocating the new pages), after the last
// part, which real S3 never charges. Here a completed upload stays as its part files, moved
// (renamed) into a directory that a symlink `<key>._S3rver_parts` names, beside a sparse
// placeholder of the object's size so s3rver's HEAD, listing and range checks work unchanged;
// GETs stream the requested range from the parts. The ETag is S3's multipart one (MD5 of the
// parts' MD5s, "-<count>"), the parts are checked against the ETags the client sent
// (InvalidPart), and both the symlink and the placeholder are swapped in by rename.
const crypto = require('crypto');
const fs = require('fs');
const fsp = require('fs/promises');
const path = require('path');
const { Readable, Transform } = require('stream');
const { pipeline } = require('stream/promises');
const S3Error = require('s3rver/lib/models/error');
const S3Object = require('s3rver/lib/models/object');

const store = server.store;
const partsLink = (bucket, key) => store.getResourcePath(bucket, key, 'parts');

async function readManifest(bucket, key) {
  try {
    const dir = await fsp.realpath(partsLink(bucket, key));
    const sizes = JSON.parse(await fsp.readFile(path.join(dir, 'manifest.json'), 'utf8'));
    return { dir, sizes };
  } catch (err) {
    if (err.code === 'ENOENT') return null;
    throw err;
  }
}

async function dropParts(bucket, key) {
  const link = partsLink(bucket, key);
  let dir = null;
  try {
    dir = await fsp.realpath(link);
  } catch (err) {
    if (err.code !== 'ENOENT') throw err;
  }
  await fsp.rm(link, { force: true });
  if (dir) await fsp.rm(dir, { recursive: true, force: true });
}

function partsStream({ dir, sizes }, start, end) {
  return Readable.from(
    (async function* chunks() {
      let offset = 0;
      for (const [index, size] of sizes.entries()) {
        const from = Math.max(start, offset);
        const to = Math.min(end, offset + size - 1);
        if (from <= to) {
          const file = path.join(dir, String(index + 1));
          yield* fs.createReadStream(file, { start: from - offset, end: to - offset });
        }
        offset += size;
      }
    })(),
  );
}

store.putObjectMultipart = async function putObjectMultipart(bucket, uploadId, parts) {
  const uploadDir = path.join(this.getResourcePath(bucket, undefined, 'uploads'), uploadId);
  const [key, metadata] = await Promise.all([
    fsp.readFile(path.join(uploadDir, 'key'), 'utf8'),
    fsp.readFile(path.join(uploadDir, 'metadata'), 'utf8').then(JSON.parse),
  ]);
  const ordered = [...parts].sort((a, b) => a.number - b.number);
  const digests = [];
  for (const part of ordered) {
    const md5 = await fsp
      .readFile(path.join(uploadDir, `${part.number}.md5`), 'utf8')
      .then((text) => text.trim())
      .catch(() => null);
    if (md5 === null || md5 !== part.etag) {
      throw new S3Error('InvalidPart', 'One or more of the specified parts could not be found.');
    }
    digests.push(Buffer.from(md5, 'hex'));
  }
  const objectPath = this.getResourcePath(bucket, key, 'object');
  const staged = `${objectPath}.${uploadId}.parts`;
  await fsp.mkdir(staged, { recursive: true });
  const sizes = [];
  for (const [index, part] of ordered.entries()) {
    const moved = path.join(staged, String(index + 1));
    await fsp.rename(path.join(uploadDir, String(part.number)), moved);
    sizes.push((await fsp.stat(moved)).size);
  }
  await fsp.writeFile(path.join(staged, 'manifest.json'), JSON.stringify(sizes));
  const size = sizes.reduce((a, b) => a + b, 0);
  const placeholder = `${objectPath}.${uploadId}.partial`;
  await fsp.writeFile(placeholder, '');
  await fsp.truncate(placeholder, size);
  const previous = await readManifest(bucket, key);
  const link = partsLink(bucket, key);
  await fsp.symlink(staged, `${link}.${uploadId}`);
  await fsp.rename(`${link}.${uploadId}`, link);
  await fsp.rename(placeholder, objectPath);
  const md5 = `${crypto.createHash('md5').update(Buffer.concat(digests)).digest('hex')}-${ordered.length}`;
  await this.putMetadata(bucket, key, new S3Object(bucket, key, null, metadata).metadata, md5);
  if (previous) await fsp.rm(previous.dir, { recursive: true, force: true });
  await fsp.rm(uploadDir, { recursive: true, force: true });
  return { size, md5 };
};

const getObject = store.getObject.bind(store);
store.getObject = async function getPartsOrObject(bucket, key, options) {
  const object = await getObject(bucket, key, options);
  const manifest = object && object.content ? await readManifest(bucket, key) : null;
  if (!manifest) return object;
  object.content.destroy(); // the placeholder's zeros
  const range = object.range || { start: 0, end: object.size - 1 };
  object.content = partsStream(manifest, range.start, range.end);
  return object;
};

// PutObject as S3 does it: all or nothing. s3rver's own truncates the object's file and streams
// the request body into it, so a client that dies mid-upload (benchmarks/preemption.py kills
// them on purpose) leaves a truncated object where the previous one was, which S3 never does.
// Here the body goes to a temporary file beside the object, renamed over it only once all of it
// (Content-Length bytes) arrived; an aborted request removes it and the previous object stays.
store.putObject = async function putObjectAtomically(object) {
  const objectPath = this.getResourcePath(object.bucket, object.key, 'object');
  await fsp.mkdir(path.dirname(objectPath), { recursive: true });
  const staged = `${objectPath}.${crypto.randomBytes(8).toString('hex')}.uploading`;
  const md5Context = crypto.createHash('md5');
  let size = 0;
  try {
    if (Buffer.isBuffer(object.content)) {
      await fsp.writeFile(staged, object.content);
      md5Context.update(object.content);
      size = object.content.length;
    } else {
      const count = new Transform({
        transform(chunk, encoding, callback) {
          md5Context.update(chunk);
          size += chunk.length;
          callback(null, chunk);
        },
      });
      await pipeline(object.content, count, fs.createWriteStream(staged));
    }
    const expected = object.metadata['content-length'];
    if (expected !== undefined && Number(expected) !== size) {
      throw new S3Error(
        'IncompleteBody',
        'You did not provide the number of bytes specified by the Content-Length HTTP header.',
      );
    }
  } catch (err) {
    await fsp.rm(staged, { force: true });
    throw err;
  }
  const md5 = md5Context.digest('hex');
  await fsp.rename(staged, objectPath);
  await this.putMetadata(object.bucket, object.key, object.metadata, md5);
  await dropParts(object.bucket, object.key);
  return { size, md5 };
};

const deleteObject = store.deleteObject.bind(store);
store.deleteObject = async function deleteObjectAndParts(bucket, key) {
  await dropParts(bucket, key);
  return deleteObject(bucket, key);
};

const copyObject = store.copyObject.bind(store);
store.copyObject = async function copyObjectNotFromParts(srcBucket, srcKey, ...rest) {
  if (await readManifest(srcBucket, srcKey)) {
    throw new S3Error('NotImplemented', 'the benchmark server does not copy objects completed from parts');
  }
  return copyObject(srcBucket, srcKey, ...rest);
};

server.run((err) => {
  if (err) {
    console.error(err);
    process.exit(1);
  }
  console.log(`listening on 127.0.0.1:${port}`);
});

for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => server.close(() => process.exit(0)));
}
