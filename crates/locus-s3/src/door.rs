//! The S3 operations, each answered by its room as the requesting subject.

use crate::checksums::{with_sums, Checksum};
use crate::keys::{subject_of, Anonymous, Keys};
use crate::listing::{self, Item, Query};
use crate::meta::Records;
use crate::multipart::{self, Uploads};
use crate::names::{bucket_dir, bucket_error, object_path, Domains};
use crate::objects::{self, acting, Conditions, PutMeta};
use crate::{S3Config, S3DoorError};
use bytes::Bytes;
use locus_proto::ops::{Mkdir, Readdir, Rmdir, Stat};
use locus_proto::Code;
use locus_server::Shared;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result, S3};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The door's state: the server, the object records and the uploads.
pub(crate) struct Door {
    shared: Arc<Shared>,
    records: Arc<Records>,
    uploads: Arc<Uploads>,
    anonymous: Option<String>,
}

/// Builds the service that answers S3 requests, and starts the sweeper of abandoned uploads.
pub(crate) fn service(shared: Arc<Shared>, config: S3Config) -> Result<s3s::service::S3Service, S3DoorError> {
    let state = |why: String| S3DoorError::State { path: config.state_dir.display().to_string(), why };
    let records = Records::open(&config.state_dir).map_err(|e| state(e.to_string()))?;
    let uploads = Arc::new(Uploads::open(&config.state_dir, config.upload_max_age).map_err(|e| state(e.to_string()))?);
    tokio::spawn(multipart::sweeper(uploads.clone()));
    let tokens = shared.tokens.clone();
    let door = Door { shared, records: Arc::new(records), uploads, anonymous: config.anonymous.clone() };
    let mut builder = s3s::service::S3ServiceBuilder::new(door);
    builder.set_auth(Keys { tokens });
    builder.set_access(Anonymous { subject: config.anonymous.clone() });
    builder.set_validation(PathNames);
    // The XML bodies the door takes (DeleteObjects, CompleteMultipartUpload) are small;
    // s3s reads one whole before parsing it.
    let mut limits = s3s::config::S3Config::default();
    limits.xml_max_body_size = 2 << 20;
    builder.set_config(Arc::new(s3s::config::StaticConfigProvider::new(Arc::new(limits))));
    if !config.domains.is_empty() {
        for d in &config.domains {
            if d.is_empty()
                || !d.split('.').all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
            {
                return Err(S3DoorError::Domain(d.clone()));
            }
        }
        builder.set_host(Domains(config.domains.iter().map(|d| d.to_ascii_lowercase()).collect()));
    }
    Ok(builder.build())
}

/// A GetObject answered `307` to this URL (s3s keeps an operation's status, so
/// [`crate::answer`] sets it).
#[derive(Clone)]
pub(crate) struct Redirect(pub hyper::header::HeaderValue);

/// Buckets are directory names of the export, checked where they are used.
struct PathNames;

impl s3s::validation::NameValidation for PathNames {
    fn validate_bucket_name(&self, name: &str) -> bool {
        bucket_dir(name).is_ok()
    }
}

fn metadata_of(m: Option<Metadata>) -> BTreeMap<String, String> {
    m.into_iter().flatten().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect()
}

fn etag(value: &str) -> ETag {
    ETag::Strong(value.to_string())
}

/// Keys as the client asked them encoded (`encoding-type=url`, which boto3 asks for).
struct Encoding(bool);

impl Encoding {
    fn of(e: &Option<EncodingType>) -> Encoding {
        Encoding(e.as_ref().is_some_and(|e| e.as_str() == EncodingType::URL))
    }

    fn key(&self, key: &str) -> String {
        const KEEP: &percent_encoding::AsciiSet =
            &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~').remove(b'/');
        if self.0 {
            percent_encoding::utf8_percent_encode(key, KEEP).to_string()
        } else {
            key.to_string()
        }
    }
}

impl Door {
    fn subject<T>(&self, req: &S3Request<T>) -> S3Result<String> {
        subject_of(req, &self.anonymous)
    }

    /// One page of a bucket's listing, with the subject's rights.
    async fn page(
        &self,
        subject: &str,
        bucket: &str,
        prefix: String,
        delimiter: Option<String>,
        after: (String, bool),
        max: Option<i32>,
    ) -> S3Result<listing::Page> {
        let dir = bucket_dir(bucket)?;
        let max = max.unwrap_or(1000).clamp(0, 1000) as usize;
        acting(&self.shared, subject, move |s| {
            let q = Query {
                bucket_dir: &dir,
                prefix: &prefix,
                delimiter: delimiter.as_deref(),
                after: &after.0,
                after_prefix: after.1,
                max,
            };
            listing::list(s, &q)
        })
        .await?
        .map_err(bucket_error)
    }

    fn contents(&self, page: &listing::Page, enc: &Encoding) -> (Vec<Object>, Vec<CommonPrefix>) {
        let (mut objects, mut prefixes) = (Vec::new(), Vec::new());
        for item in &page.items {
            match item {
                Item::Key { key, path, attr } => {
                    let tag = if key.ends_with('/') {
                        crate::meta::EMPTY_ETAG.to_string()
                    } else {
                        self.records.get_or_derive(path, attr).etag
                    };
                    objects.push(Object {
                        key: Some(enc.key(key)),
                        size: Some(attr.size as i64),
                        last_modified: Some(objects::modified(attr)),
                        e_tag: Some(etag(&tag)),
                        storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
                        ..Default::default()
                    })
                }
                Item::Prefix(p) => prefixes.push(CommonPrefix { prefix: Some(enc.key(p)) }),
            }
        }
        (objects, prefixes)
    }

    async fn read(
        &self,
        subject: &str,
        bucket: &str,
        key: &str,
        conditions: Conditions,
        range: Option<Range>,
        with_body: bool,
    ) -> S3Result<Read> {
        let op = object_path(bucket, key)?;
        let found = objects::open(&self.shared, &self.records, subject, &op).await?;
        conditions.check(&found.record.etag, &found.attr)?;
        let size = found.attr.size;
        let span = match (&range, found.growing) {
            (Some(_), true) => {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidRange,
                    "the active file is still being made: read it whole, or again once it is done",
                ))
            }
            (Some(r), false) => Some(r.check(size).map_err(|_| S3Error::new(S3ErrorCode::InvalidRange))?),
            (None, _) => None,
        };
        let (start, end) = span.as_ref().map_or((0, size), |r| (r.start, r.end));
        let length = if found.growing { None } else { Some((end - start) as i64) };
        let content_range = span.map(|r| format!("bytes {}-{}/{size}", r.start, r.end.saturating_sub(1)));
        let (attr, record, growing) = (found.attr.clone(), found.record.clone(), found.growing);
        let body = with_body.then(|| found.body(start, if growing { u64::MAX } else { end }));
        Ok(Read { attr, record, length, content_range, body })
    }
}

/// The conditional headers of a GetObject or HeadObject input (the same fields in both).
macro_rules! conditions_of {
    ($i:expr) => {
        Conditions {
            if_match: $i.if_match,
            if_none_match: $i.if_none_match,
            if_modified_since: $i.if_modified_since,
            if_unmodified_since: $i.if_unmodified_since,
        }
    };
}

/// The conditions on a copy's source (CopyObject, UploadPartCopy).
macro_rules! copy_conditions {
    ($i:expr) => {
        Conditions {
            if_match: $i.copy_source_if_match,
            if_none_match: $i.copy_source_if_none_match,
            if_modified_since: $i.copy_source_if_modified_since,
            if_unmodified_since: $i.copy_source_if_unmodified_since,
        }
    };
}

/// What GetObject and HeadObject both answer of a [`Read`] (the same fields in both
/// outputs), with any more fields given.
macro_rules! described {
    ($ty:ident, $read:expr, $content_type:expr $(, $field:ident: $value:expr)*) => {
        $ty {
            $($field: $value,)*
            content_length: $read.length,
            content_range: $read.content_range,
            content_type: $content_type.or($read.record.content_type),
            e_tag: Some(etag(&$read.record.etag)),
            last_modified: Some(objects::modified(&$read.attr)),
            metadata: Some($read.record.metadata.into_iter().collect()),
            accept_ranges: Some("bytes".into()),
            ..Default::default()
        }
    };
}

struct Read {
    attr: locus_proto::types::Attr,
    record: crate::meta::Record,
    length: Option<i64>,
    content_range: Option<String>,
    body: Option<StreamingBlob>,
}

fn header_md5<T>(req: &S3Request<T>) -> S3Result<Option<[u8; 16]>> {
    objects::content_md5(req.headers.get("content-md5").and_then(|v| v.to_str().ok()))
}

#[async_trait::async_trait]
impl S3 for Door {
    async fn list_buckets(&self, req: S3Request<ListBucketsInput>) -> S3Result<S3Response<ListBucketsOutput>> {
        let subject = self.subject(&req)?;
        let entries =
            match acting(&self.shared, &subject, |s| s.call(&Readdir { path: "/".into() }, Bytes::new())).await? {
                Ok((pages, _)) => pages,
                // A subject with rights on some buckets only, not on the export's root, sees
                // none listed (as S3 lists only one's own); it reaches its buckets by name.
                Err(e) if e.code == Code::ACCES || e.code == Code::PERM => Vec::new(),
                Err(e) => return Err(bucket_error(e)),
            };
        let buckets = entries
            .into_iter()
            .flatten()
            .filter(|e| e.attr.is_dir() && bucket_dir(&e.name).is_ok())
            .map(|e| Bucket {
                name: Some(e.name),
                creation_date: Some(objects::modified(&e.attr)),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput { buckets: Some(buckets), ..Default::default() }))
    }

    async fn create_bucket(&self, req: S3Request<CreateBucketInput>) -> S3Result<S3Response<CreateBucketOutput>> {
        let subject = self.subject(&req)?;
        let dir = bucket_dir(&req.input.bucket)?;
        let made =
            acting(&self.shared, &subject, move |s| s.call(&Mkdir { path: dir, mode: 0o755 }, Bytes::new())).await?;
        match made {
            Ok(_) => {}
            Err(e) if e.code == Code::EXIST => return Err(S3Error::new(S3ErrorCode::BucketAlreadyOwnedByYou)),
            Err(e) => return Err(bucket_error(e)),
        }
        let location = format!("/{}", req.input.bucket);
        Ok(S3Response::new(CreateBucketOutput { location: Some(location) }))
    }

    async fn delete_bucket(&self, req: S3Request<DeleteBucketInput>) -> S3Result<S3Response<DeleteBucketOutput>> {
        let subject = self.subject(&req)?;
        let dir = bucket_dir(&req.input.bucket)?;
        acting(&self.shared, &subject, move |s| s.call(&Rmdir { path: dir }, Bytes::new()))
            .await?
            .map_err(bucket_error)?;
        Ok(S3Response::new(DeleteBucketOutput {}))
    }

    async fn head_bucket(&self, req: S3Request<HeadBucketInput>) -> S3Result<S3Response<HeadBucketOutput>> {
        let subject = self.subject(&req)?;
        let dir = bucket_dir(&req.input.bucket)?;
        // Rights on the bucket itself suffice (a subject may hold none at the export's root).
        let found = acting(&self.shared, &subject, move |s| {
            if s.rights(&dir).0 != 0 {
                return Ok(true);
            }
            s.call(&Stat { path: dir }, Bytes::new()).map(|(pages, _)| pages.first().is_some_and(|a| a.is_dir()))
        })
        .await?
        .map_err(bucket_error)?;
        if !found {
            return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
        }
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let input = HeadBucketInput { bucket: req.input.bucket.clone(), ..Default::default() };
        self.head_bucket(req.map_input(|_| input)).await?;
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }

    async fn list_objects_v2(&self, req: S3Request<ListObjectsV2Input>) -> S3Result<S3Response<ListObjectsV2Output>> {
        let subject = self.subject(&req)?;
        let i = req.input;
        let after = match &i.continuation_token {
            Some(t) => listing::resume(t).ok_or_else(|| {
                S3Error::with_message(
                    S3ErrorCode::InvalidArgument,
                    "the continuation token is not one this server gave",
                )
            })?,
            None => (i.start_after.clone().unwrap_or_default(), false),
        };
        let prefix = i.prefix.clone().unwrap_or_default();
        let page = self.page(&subject, &i.bucket, prefix, i.delimiter.clone(), after, i.max_keys).await?;
        let enc = Encoding::of(&i.encoding_type);
        let (contents, prefixes) = self.contents(&page, &enc);
        let next = page.truncated.then(|| page.items.last().map(listing::continuation)).flatten();
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(i.bucket),
            prefix: Some(enc.key(&i.prefix.unwrap_or_default())),
            delimiter: i.delimiter.map(|d| enc.key(&d)),
            max_keys: Some(i.max_keys.unwrap_or(1000)),
            key_count: Some(page.items.len() as i32),
            is_truncated: Some(page.truncated),
            continuation_token: i.continuation_token,
            next_continuation_token: next,
            start_after: i.start_after.map(|s| enc.key(&s)),
            encoding_type: i.encoding_type,
            contents: Some(contents),
            common_prefixes: Some(prefixes),
            ..Default::default()
        }))
    }

    async fn list_objects(&self, req: S3Request<ListObjectsInput>) -> S3Result<S3Response<ListObjectsOutput>> {
        let subject = self.subject(&req)?;
        let i = req.input;
        // A marker that names a prefix this server gave stands for everything under it.
        let marker = i.marker.clone().unwrap_or_default();
        let is_prefix = i.delimiter.as_deref().is_some_and(|d| !d.is_empty() && marker.ends_with(d));
        let prefix = i.prefix.clone().unwrap_or_default();
        let page = self.page(&subject, &i.bucket, prefix, i.delimiter.clone(), (marker, is_prefix), i.max_keys).await?;
        let enc = Encoding::of(&i.encoding_type);
        let (contents, prefixes) = self.contents(&page, &enc);
        let next_marker =
            (page.truncated && i.delimiter.is_some()).then(|| page.items.last().map(|x| enc.key(x.name()))).flatten();
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(i.bucket),
            prefix: Some(enc.key(&i.prefix.unwrap_or_default())),
            delimiter: i.delimiter.map(|d| enc.key(&d)),
            marker: Some(enc.key(&i.marker.unwrap_or_default())),
            max_keys: Some(i.max_keys.unwrap_or(1000)),
            is_truncated: Some(page.truncated),
            next_marker,
            encoding_type: i.encoding_type,
            contents: Some(contents),
            common_prefixes: Some(prefixes),
            ..Default::default()
        }))
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let subject = self.subject(&req)?;
        let i = req.input;
        if i.part_number.is_some() {
            return Err(S3Error::with_message(S3ErrorCode::NotImplemented, "reads by part number are not offered"));
        }
        let conditions = conditions_of!(i);
        // A presigned GET on a cluster head is sent to the data node holding the bytes
        // (SPIRAL's third-party transfer); the head streams what it cannot send there,
        // and a GET asking for response headers of its own (`response-*`), which the
        // node would not give.
        let keys = || crate::query_params(req.uri.query().unwrap_or("")).map(|(k, _)| k);
        let presigned = keys().any(|k| k == "X-Amz-Signature") && !keys().any(|k| k.starts_with("response-"));
        if presigned && self.shared.is_head() {
            // The subject's right to read, the conditions and the range, as the head sees them.
            let read = self.read(&subject, &i.bucket, &i.key, conditions.clone(), i.range.clone(), false).await?;
            let path = object_path(&i.bucket, &i.key)?.path;
            let url = tokio::task::block_in_place(|| self.shared.node_url(&subject, &path, &read.attr));
            if let Some(url) = url.and_then(|u| hyper::header::HeaderValue::from_str(&u).ok()) {
                let mut resp = S3Response::new(GetObjectOutput::default());
                resp.extensions.insert(Redirect(url));
                return Ok(resp);
            }
        }
        let read = self.read(&subject, &i.bucket, &i.key, conditions, i.range, true).await?;
        Ok(S3Response::new(described!(GetObjectOutput, read, i.response_content_type, body: read.body)))
    }

    async fn head_object(&self, req: S3Request<HeadObjectInput>) -> S3Result<S3Response<HeadObjectOutput>> {
        let subject = self.subject(&req)?;
        let i = req.input;
        let conditions = conditions_of!(i);
        let read = self.read(&subject, &i.bucket, &i.key, conditions, i.range, false).await?;
        Ok(S3Response::new(described!(HeadObjectOutput, read, i.response_content_type)))
    }

    async fn put_object(&self, req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
        let subject = self.subject(&req)?;
        let content_md5 = header_md5(&req)?;
        let checksum = Checksum::of(&req)?;
        let i = req.input;
        let op = object_path(&i.bucket, &i.key)?;
        let create_only = objects::create_only(&i.if_match, &i.if_none_match)?;
        if create_only {
            // Create only: refused at once if the key holds an object now, and when the
            // upload ends if one came meanwhile (`PUT_NEW`).
            let exists = objects::open(&self.shared, &self.records, &subject, &op).await.is_ok();
            if exists {
                return Err(S3Error::new(S3ErrorCode::PreconditionFailed));
            }
        }
        let meta = PutMeta {
            content_type: i.content_type,
            metadata: metadata_of(i.metadata),
            content_md5,
            checksum,
            length: i.content_length.map(|l| l.max(0) as u64),
            create_only,
        };
        let (tag, attr, sums) = objects::put(&self.shared, &self.records, &subject, &op, i.body, meta).await?;
        Ok(S3Response::new(with_sums!(sums, PutObjectOutput { e_tag: Some(etag(&tag)), size: Some(attr.size as i64) })))
    }

    async fn delete_object(&self, req: S3Request<DeleteObjectInput>) -> S3Result<S3Response<DeleteObjectOutput>> {
        let subject = self.subject(&req)?;
        let op = object_path(&req.input.bucket, &req.input.key)?;
        objects::delete(&self.shared, &self.records, &subject, &op).await?;
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn delete_objects(&self, req: S3Request<DeleteObjectsInput>) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let subject = self.subject(&req)?;
        let i = req.input;
        if i.delete.objects.len() > 1000 {
            return Err(S3Error::with_message(S3ErrorCode::MalformedXML, "at most 1000 keys at once"));
        }
        let quiet = i.delete.quiet.unwrap_or(false);
        let (mut deleted, mut errors) = (Vec::new(), Vec::new());
        for o in i.delete.objects {
            let done = match object_path(&i.bucket, &o.key) {
                Ok(op) => objects::delete(&self.shared, &self.records, &subject, &op).await,
                Err(e) => Err(e),
            };
            match done {
                Ok(()) if !quiet => deleted.push(DeletedObject { key: Some(o.key), ..Default::default() }),
                Ok(()) => {}
                Err(e) => errors.push(Error {
                    code: Some(e.code().as_str().to_string()),
                    key: Some(o.key),
                    message: e.message().map(str::to_string),
                    ..Default::default()
                }),
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput { deleted: Some(deleted), errors: Some(errors), ..Default::default() }))
    }

    async fn copy_object(&self, req: S3Request<CopyObjectInput>) -> S3Result<S3Response<CopyObjectOutput>> {
        let subject = self.subject(&req)?;
        let i = req.input;
        let to = object_path(&i.bucket, &i.key)?;
        let (from, source) =
            objects::copy_source(&self.shared, &self.records, &subject, &i.copy_source, copy_conditions!(i)).await?;
        let replace = i.metadata_directive.as_ref().is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        if from == to && !replace {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidRequest,
                "copying an object onto itself needs the REPLACE metadata directive",
            ));
        }
        let (content_type, metadata) = if replace {
            (i.content_type, metadata_of(i.metadata))
        } else {
            (source.record.content_type.clone(), source.record.metadata.clone())
        };
        let (tag, attr) = if source.is_stored() && !from.is_dir {
            // The bytes are the source's: so is an MD5 ETag; a derived one is the copy's own.
            let attr = objects::copy(&self.shared, &subject, &from, &to).await?;
            let tag = match source.record.etag.contains('-') {
                true => crate::meta::derived_etag(&attr),
                false => source.record.etag.clone(),
            };
            let record = crate::meta::Record { etag: tag.clone(), content_type, metadata };
            self.records.put(&to.path, &attr, &record);
            (tag, attr)
        } else {
            // An active file's output: streamed into the copy at the server.
            let length = (!source.growing).then_some(source.attr.size);
            let body = source.body(0, length.unwrap_or(u64::MAX));
            let meta = PutMeta { content_type, metadata, length, ..PutMeta::default() };
            objects::put(&self.shared, &self.records, &subject, &to, Some(body), meta).await.map(|(t, a, _)| (t, a))?
        };
        let result = CopyObjectResult {
            e_tag: Some(etag(&tag)),
            last_modified: Some(objects::modified(&attr)),
            ..Default::default()
        };
        Ok(S3Response::new(CopyObjectOutput { copy_object_result: Some(result), ..Default::default() }))
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let subject = self.subject(&req)?;
        let i = req.input;
        self.uploads.get_to(&subject, &i.upload_id, &i.bucket, &i.key)?;
        let (_, source) =
            objects::copy_source(&self.shared, &self.records, &subject, &i.copy_source, copy_conditions!(i)).await?;
        let (start, end) = multipart::copy_range(i.copy_source_range.as_deref(), &source)?;
        let modified = objects::modified(&source.attr);
        let body = source.body(start, end);
        let length = Some(end - start);
        let (tag, _) =
            self.uploads.put_part(&subject, &i.upload_id, i.part_number, Some(body), length, None, None).await?;
        let result = CopyPartResult { e_tag: Some(etag(&tag)), last_modified: Some(modified), ..Default::default() };
        Ok(S3Response::new(UploadPartCopyOutput { copy_part_result: Some(result), ..Default::default() }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        if req.credentials.is_none() {
            // Uploads are their subject's, and every unsigned client is the same subject.
            return Err(S3Error::with_message(S3ErrorCode::AccessDenied, "multipart uploads need a signed request"));
        }
        let subject = self.subject(&req)?;
        let i = req.input;
        let op = object_path(&i.bucket, &i.key)?;
        if op.is_dir {
            return Err(S3Error::with_message(S3ErrorCode::InvalidArgument, "a key ending in '/' names a directory"));
        }
        // The subject must be able to write where the key is (its nearest directory that
        // exists, as the key's directories are made on completion).
        let (bucket_dir_, path) = (op.bucket_dir.clone(), op.path.clone());
        let may = acting(&self.shared, &subject, move |s| {
            let mut dir = crate::names::parent(&path).to_string();
            loop {
                let rights = s.rights(&dir);
                if rights.0 != 0 || dir.len() <= bucket_dir_.len() {
                    return rights.contains(locus_proto::types::Rights::WRITE);
                }
                dir = crate::names::parent(&dir).to_string();
            }
        })
        .await?;
        if !may {
            return Err(S3Error::with_message(S3ErrorCode::AccessDenied, "no write right where that key would be"));
        }
        let upload = multipart::new_upload(&subject, &i.bucket, &i.key, i.content_type, metadata_of(i.metadata));
        let id = self.uploads.create(&upload)?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(id),
            ..Default::default()
        }))
    }

    async fn upload_part(&self, req: S3Request<UploadPartInput>) -> S3Result<S3Response<UploadPartOutput>> {
        let subject = self.subject(&req)?;
        let content_md5 = header_md5(&req)?;
        let checksum = Checksum::of(&req)?;
        let i = req.input;
        self.uploads.get_to(&subject, &i.upload_id, &i.bucket, &i.key)?;
        let length = i.content_length.map(|l| l.max(0) as u64);
        let (tag, sums) =
            self.uploads.put_part(&subject, &i.upload_id, i.part_number, i.body, length, content_md5, checksum).await?;
        Ok(S3Response::new(with_sums!(sums, UploadPartOutput { e_tag: Some(etag(&tag)) })))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let subject = self.subject(&req)?;
        let i = req.input;
        self.uploads.get_to(&subject, &i.upload_id, &i.bucket, &i.key)?;
        let op = object_path(&i.bucket, &i.key)?;
        let create_only = objects::create_only(&i.if_match, &i.if_none_match)?;
        let parts: Vec<(i32, String)> = i
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.part_number.unwrap_or(0), p.e_tag.map(|e| e.value().to_string()).unwrap_or_default()))
            .collect();
        let (id, uploads) = (&i.upload_id, &self.uploads);
        let tag = uploads.complete(&self.shared, &self.records, &subject, id, &op, &parts, create_only).await?;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(i.bucket.clone()),
            key: Some(i.key.clone()),
            e_tag: Some(etag(&tag)),
            location: Some(format!("/{}/{}", i.bucket, i.key)),
            ..Default::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let subject = self.subject(&req)?;
        self.uploads.abort(&subject, &req.input.upload_id)?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    async fn list_parts(&self, req: S3Request<ListPartsInput>) -> S3Result<S3Response<ListPartsOutput>> {
        let subject = self.subject(&req)?;
        let i = req.input;
        let max = i.max_parts.unwrap_or(1000).clamp(1, 1000) as usize;
        let marker = i.part_number_marker.unwrap_or(0);
        let all = self.uploads.parts(&subject, &i.upload_id)?;
        let mut after: Vec<_> = all.into_iter().filter(|p| p.number > marker).collect();
        let truncated = after.len() > max;
        after.truncate(max);
        let next = after.last().map(|p| p.number);
        let parts = after
            .into_iter()
            .map(|p| Part {
                part_number: Some(p.number),
                e_tag: Some(etag(&p.etag)),
                size: Some(p.size as i64),
                last_modified: Some(Timestamp::from(p.modified)),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(i.upload_id),
            max_parts: Some(max as i32),
            part_number_marker: i.part_number_marker,
            next_part_number_marker: next,
            is_truncated: Some(truncated),
            parts: Some(parts),
            ..Default::default()
        }))
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let subject = self.subject(&req)?;
        let i = req.input;
        let prefix = i.prefix.clone().unwrap_or_default();
        let uploads = self
            .uploads
            .list(&subject, &i.bucket)
            .into_iter()
            .filter(|(_, u)| u.key.starts_with(&prefix))
            .map(|(id, u)| MultipartUpload {
                key: Some(u.key),
                upload_id: Some(id),
                initiated: Some(Timestamp::from(std::time::UNIX_EPOCH + std::time::Duration::from_secs(u.started))),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(i.bucket),
            prefix: i.prefix,
            is_truncated: Some(false),
            uploads: Some(uploads),
            ..Default::default()
        }))
    }
}
